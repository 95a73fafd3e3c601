package cli

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
)

// Snapshots: kloud machine snapshot|snapshots|restore, kloud snapshot list|delete, and kloud
// serve's --snapshot-quota.

// snapshotQuotaFlag is --snapshot-quota COUNT,SIZE (kloud.ParseSnapshotQuota).
type snapshotQuotaFlag struct{ q *kloud.SnapshotQuota }

func (f snapshotQuotaFlag) String() string {
	if f.q == nil || *f.q == (kloud.SnapshotQuota{}) {
		return fmt.Sprintf("%d,%dG", kloud.DefaultSnapshotCount, kloud.DefaultSnapshotBytes>>30)
	}
	c, b := fmt.Sprint(f.q.Count), fmt.Sprint(f.q.Bytes)
	if f.q.Count < 0 {
		c = "unlimited"
	}
	if f.q.Bytes < 0 {
		b = "unlimited"
	}
	return c + "," + b
}

func (f snapshotQuotaFlag) Set(s string) error {
	q, err := kloud.ParseSnapshotQuota(s)
	if err != nil {
		return err
	}
	*f.q = q
	return nil
}

func (f snapshotQuotaFlag) Type() string { return "COUNT,SIZE" }

const snapshotQuotaUsage = "each user's machine snapshots: how many and how many bytes (K, M, G, T; \"unlimited\" for either)"

// machineSnapshotCmds are the snapshot subcommands of `kloud machine`.
func machineSnapshotCmds(g *globals) []*cobra.Command {
	var sstack, name string
	var sdetach bool
	snapshot := &cobra.Command{
		Use:   "snapshot MACHINE [--name NAME]",
		Short: "Save a machine's disk (a running machine is stopped, saved and started again)",
		Long: `Save a machine's disk as a snapshot, kept by its provider (local: a compressed archive of
the machine's overlay disk in kloud's state directory). A running machine is stopped first and
started again after (its agent reconnects); a stopped one stays stopped. Snapshots are yours,
count against your quota (kloud machine snapshots shows it) and outlive the machine: restore one
with kloud machine restore, delete it with kloud snapshot delete.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.onMachine(cmd.Context(), args[0], sstack, func(conn *kite.Conn, id string) error {
				res, err := api.NewClient(conn).MachineSnapshot(cmd.Context(), api.SnapshotParams{MachineID: id, Name: name})
				if err != nil {
					return explain(err)
				}
				// With --json: this result first, then the job's events, one JSON line each.
				if g.json {
					if err := g.printJSON(res); err != nil {
						return err
					}
				} else {
					fmt.Fprintf(g.stderr, "snapshot %s (job %s)\n", res.SnapshotID, res.JobID)
				}
				if sdetach {
					return nil
				}
				if _, err := g.watchJob(cmd.Context(), conn, res.JobID); err != nil {
					return err
				}
				if !g.json {
					fmt.Fprintln(g.stdout, res.SnapshotID) // last: for scripts
				}
				return nil
			})
		},
	}
	snapshot.Flags().StringVar(&name, "name", "", "a name for it (default: the machine's label and the time)")
	snapshot.Flags().StringVar(&sstack, "stack", "", "the machine's stack (when labels repeat)")
	detachFlag(snapshot, &sdetach)

	var rstack, into string
	var rdetach bool
	restore := &cobra.Command{
		Use:   "restore SNAPSHOT [--into MACHINE]",
		Short: "Replace a machine's disk by a snapshot's (default: the machine it was taken of)",
		Long: `Replace a machine's disk by a snapshot's: by default the machine it was taken of; with
--into, another machine of the same provider (it keeps its own identity and agent). A running
machine is stopped first and started again after. What was on its disk is lost.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.onMachine(cmd.Context(), into, rstack, func(c *kite.Conn, id string) error {
				res, err := api.NewClient(c).MachineRestore(cmd.Context(), api.RestoreParams{SnapshotID: args[0], MachineID: id})
				if err != nil {
					return explain(err)
				}
				_, err = g.followJob(cmd.Context(), c, res.JobID, rdetach)
				return err
			})
		},
	}
	restore.Flags().StringVar(&into, "into", "", "restore into this machine (id or label) instead")
	restore.Flags().StringVar(&rstack, "stack", "", "the --into machine's stack (when labels repeat)")
	detachFlag(restore, &rdetach)
	return []*cobra.Command{snapshot, snapshotsCmd(g, "snapshots [MACHINE]"), restore}
}

// snapshotsCmd lists the caller's snapshots (kloud machine snapshots, kloud snapshot list).
func snapshotsCmd(g *globals, use string) *cobra.Command {
	var stack string
	c := &cobra.Command{
		Use:   use,
		Short: "List your snapshots (of one machine with MACHINE), with your quota",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var machine string
			if len(args) == 1 {
				machine = args[0]
			}
			var res api.SnapshotsResult
			err := g.onMachine(cmd.Context(), machine, stack, func(c *kite.Conn, id string) error {
				var err error
				res, err = api.NewClient(c).MachineSnapshots(cmd.Context(), api.SnapshotsParams{MachineID: id})
				return explain(err)
			})
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(res)
			}
			tw := newTable(g.stdout, "ID", "NAME", "MACHINE", "PROVIDER", "STATUS", "SIZE", "CREATED")
			for _, s := range res.Snapshots {
				status := s.Status
				if s.Error != "" {
					status += ": " + firstLine(s.Error)
				}
				tw.row(s.ID, s.Name, s.MachineLabel, s.Provider, status, sizeOf(s.Size), s.CreatedAt.Local().Format(time.DateTime))
			}
			tw.flush()
			count := func(n int64) string { return fmt.Sprint(n) }
			fmt.Fprintf(g.stdout, "used %d of %s snapshots, %s of %s\n", res.Used.Count, limit(int64(res.Quota.Count), count),
				sizeOf(res.Used.Bytes), limit(res.Quota.Bytes, sizeOf))
			return nil
		},
	}
	c.Flags().StringVar(&stack, "stack", "", "the machine's stack (when labels repeat)")
	return c
}

// limit is a quota for people: 0 is no limit.
func limit(n int64, f func(int64) string) string {
	if n == 0 {
		return "unlimited"
	}
	return f(n)
}

func sizeOf(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1fG", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1fM", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1fK", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%dB", n)
}

// snapshotCmd is `kloud snapshot`: list and delete snapshots.
func snapshotCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "snapshot", Short: "List and delete machine snapshots (take and restore them with kloud machine)"}
	del := &cobra.Command{
		Use:   "delete SNAPSHOT...",
		Short: "Delete snapshots (their data too; also of machines that are gone)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, id := range args {
				s, err := call(cmd.Context(), g, (*api.Client).SnapshotDelete, api.SnapshotRef{SnapshotID: id})
				if err != nil {
					return err
				}
				if !g.json {
					fmt.Fprintf(g.stdout, "deleted snapshot %s (%s of %s, %s)\n", s.ID, s.Name, s.MachineLabel, sizeOf(s.Size))
				}
			}
			return nil
		},
	}
	cmd.AddCommand(snapshotsCmd(g, "list [MACHINE]"), del)
	return cmd
}
