package cli

import (
	"fmt"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/kloud-dev/kloud/kloud/api"
)

// Prebuilt stacks: kloud pool set|list|delete (pool.set, pool.list, pool.delete; kloud/pools.go).

// poolCmd is `kloud pool`.
func poolCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "pool",
		Short: "Prebuilt stacks: keep stacks of a template built for users to claim (kloud administrators)",
		Long: `A pool keeps SIZE stacks of a template's latest revision (and preset, when the template has
parameters) built and owned by no user (kloud-pool). A member's "kloud stack create --template ID"
with no values of its own takes one of them, already built, and its machines change hands to
that member (agent key, account, home) without a rebuild; the pool then builds another. A new
template revision replaces the pool's idle stacks. Pool stacks count against their team's pool
quota (kloud quota set --pool TEAM), never a user's.`,
	}
	var sp api.PoolSetParams
	var schedule []string
	set := &cobra.Command{
		Use:   "set TEMPLATE --size N [--preset P] [--schedule 'DAYS HH:MM-HH:MM=N' ...] [--time-zone TZ]",
		Short: "Create or resize a template's pool (size 0: destroy its idle stacks, keep the pool)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sp.TemplateID = args[0]
			for _, w := range schedule {
				pw, err := api.ParsePoolWindow(w)
				if err != nil {
					return fmt.Errorf("--schedule: %w", err)
				}
				sp.Schedule = append(sp.Schedule, pw)
			}
			v, err := call(cmd.Context(), g, (*api.Client).PoolSet, sp)
			if err != nil {
				return err
			}
			return printPools(g, v)
		},
	}
	set.Flags().IntVar(&sp.Size, "size", 0, fmt.Sprintf("stacks to keep built (0 to %d)", api.MaxPoolSize))
	set.Flags().StringVar(&sp.Preset, "preset", "", "the template's preset the stacks are built with (default: none)")
	set.Flags().StringArrayVar(&schedule, "schedule", nil, "a window with its own size, e.g. 'weekdays 08:00-18:00=5' (repeatable; the first that holds the time wins; outside them: --size; DAYS as machine set --autostart's)")
	set.Flags().StringVar(&sp.TimeZone, "time-zone", "", "the schedule's time zone, e.g. Europe/Berlin (default UTC)")
	set.MarkFlagRequired("size")
	var lp api.PoolListParams
	list := &cobra.Command{
		Use:   "list [--team T]",
		Short: "List pools and their stacks: ready, building, stale, failed, claimed",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			res, err := call(cmd.Context(), g, (*api.Client).PoolList, lp)
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(res)
			}
			return printPools(g, res.Pools...)
		},
	}
	list.Flags().StringVar(&lp.Team, "team", "", "one team's pools (default: all)")
	del := &cobra.Command{
		Use:   "delete POOL",
		Short: "Delete a pool: its idle stacks are destroyed, claimed ones stay their users'",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			res, err := call(cmd.Context(), g, (*api.Client).PoolDelete, api.PoolRef{ID: args[0]})
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(res)
			}
			fmt.Fprintf(g.stdout, "pool %s deleted; kloud destroys its idle stacks\n", args[0])
			return nil
		},
	}
	cmd.AddCommand(set, list, del)
	return cmd
}

// printPools prints pools as a table (with --json, one pool as an object).
func printPools(g *globals, ps ...api.PoolView) error {
	if g.json && len(ps) == 1 {
		return g.printJSON(ps[0])
	}
	t := newTable(g.stdout, "POOL", "TEAM", "REV", "SIZE", "NOW", "READY", "BUILDING", "STALE", "FAILED", "CLAIMED")
	n := strconv.Itoa
	for _, p := range ps {
		t.row(p.ID, p.Team, n(p.Rev), n(p.Size), n(p.Current), n(p.Ready), n(p.Building), n(p.Stale), n(p.Failed), n(p.Claimed))
	}
	if err := t.flush(); err != nil {
		return err
	}
	for _, p := range ps {
		for _, w := range p.Schedule {
			tz := p.TimeZone
			if tz == "" {
				tz = "UTC"
			}
			fmt.Fprintf(g.stdout, "pool %s: %s %s-%s (%s): %d\n", p.ID, w.Days, w.From, w.To, tz, w.Size)
		}
		if p.Problem != "" {
			fmt.Fprintf(g.stdout, "pool %s is below its size: %s\n", p.ID, p.Problem)
		}
	}
	return nil
}
