package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
)

// machineUpgradeAgentCmd is `kloud machine upgrade-agent` (machine.upgradeAgent).
func machineUpgradeAgentCmd(g *globals) *cobra.Command {
	var stack string
	c := &cobra.Command{
		Use:   "upgrade-agent MACHINE",
		Short: "Replace a running machine's agent (klient) with the one this kloud serves; terminals stay open",
		Long: `Replace a running machine's agent, klient, with the klient binary this kloud serves (the
one machines install when they are built), without closing any terminal or SSH session:
klient downloads it, checks its SHA-256, replaces its binary and restarts in place; shells live
in holder processes that the new klient reconnects to (same shell, background jobs, scrollback).
If the download or the check fails, the old klient keeps running. Owner, team admins and kloud
owners may upgrade a machine's agent; kloud serve --agent-rollout=auto (the default) does it for
every agent that connects with another klient.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var res api.UpgradeAgentResult
			err := g.onMachine(cmd.Context(), args[0], stack, func(conn *kite.Conn, id string) error {
				var err error
				res, err = api.NewClient(conn).MachineUpgradeAgent(cmd.Context(), api.MachineRef{MachineID: id})
				return err
			})
			if err != nil {
				return explain(err)
			}
			if g.json {
				return g.printJSON(res)
			}
			if !res.Upgraded {
				fmt.Fprintf(g.stdout, "machine %s (%s): its agent already runs this kloud's klient (%s, sha256 %.12s)\n", res.MachineID, res.Label, res.OldVersion, res.OldSHA256)
				return nil
			}
			fmt.Fprintf(g.stdout, "machine %s (%s): agent upgraded from %s (sha256 %.12s) to %s (sha256 %.12s); %d terminal session(s) kept\n",
				res.MachineID, res.Label, res.OldVersion, res.OldSHA256, res.NewVersion, res.NewSHA256, res.Sessions)
			return nil
		},
	}
	c.Flags().StringVar(&stack, "stack", "", "the machine's stack (when labels repeat)")
	return c
}
