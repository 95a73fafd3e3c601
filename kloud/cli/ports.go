package cli

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
)

// kloud machine ports MACHINE [open|close PORT[/PROTO]... --from SRC]: a machine's firewall
// (machine.ports.*; providers with the firewall capability).

func machinePortsCmd(g *globals) *cobra.Command {
	var stack string
	cmd := &cobra.Command{
		Use:   "ports MACHINE",
		Short: "List a machine's firewall rules (who may reach which port from other machines)",
		Long: `List the ingress rules of MACHINE. With no rules a machine is reached by kloud (its agent)
and its owner's other machines only; "open" lets other machines in:

  kloud machine ports open dev.0 8000              # tcp 8000 from any machine
  kloud machine ports open dev.0 5432 --from team  # from the team's machines
  kloud machine ports open dev.0 53/udp --from 10.200.0.0/24
  kloud machine ports close dev.0 8000              # every rule of port 8000 (tcp and udp, any source)
  kloud machine ports close dev.0 5432 --from team  # only that one

Closing a rule that is not open fails and lists the rules that are.

To reach a machine's port from your computer or browser, use kloud port-forward or the
machine's web app link instead: they go through kloud and need no rule.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var res api.PortsResult
			err := g.onMachine(cmd.Context(), args[0], stack, func(conn *kite.Conn, id string) error {
				var err error
				res, err = api.NewClient(conn).MachinePortsList(cmd.Context(), api.MachineRef{MachineID: id})
				return err
			})
			if err != nil {
				return explain(err)
			}
			return printPorts(g, res)
		},
	}
	cmd.PersistentFlags().StringVar(&stack, "stack", "", "the machine's stack (when labels repeat)")
	change := func(open bool) *cobra.Command {
		var from string
		use, short := "close", "Close ports of a machine's firewall (every rule of a port unless PORT/PROTO or --from narrows it)"
		fromDefault, fromUsage := "", "close only the rule from this source: any, team, owner, kloud or an IPv4 CIDR (default: every source)"
		if open {
			use, short = "open", "Open ports of a machine's firewall to other machines"
			fromDefault, fromUsage = "any", "who may connect: any, team, owner, kloud or an IPv4 CIDR"
		}
		c := &cobra.Command{
			Use:   use + " MACHINE PORT[/tcp|/udp]...",
			Short: short,
			Args:  cobra.MinimumNArgs(2),
			RunE: func(cmd *cobra.Command, args []string) error {
				rules, err := parseRules(args[1:], from, open)
				if err != nil {
					return err
				}
				var res api.PortsResult
				err = g.onMachine(cmd.Context(), args[0], stack, func(conn *kite.Conn, id string) error {
					c := api.NewClient(conn)
					p := api.PortsParams{MachineID: id, Rules: rules}
					var err error
					if open {
						res, err = c.MachinePortsOpen(cmd.Context(), p)
					} else {
						res, err = c.MachinePortsClose(cmd.Context(), p)
					}
					return err
				})
				if err != nil {
					return explain(err)
				}
				return printPorts(g, res)
			},
		}
		c.Flags().StringVar(&from, "from", fromDefault, fromUsage)
		return c
	}
	cmd.AddCommand(change(true), change(false))
	return cmd
}

// parseRules reads PORT[/PROTO] arguments with source from. To open (defaults), an omitted
// protocol is tcp and an omitted source any; to close they stay omitted: every protocol, every
// source of the port.
func parseRules(args []string, from string, defaults bool) ([]api.PortRule, error) {
	var out []api.PortRule
	for _, a := range args {
		p, proto, _ := strings.Cut(a, "/")
		n, err := strconv.Atoi(p)
		if err != nil {
			return nil, fmt.Errorf("%q: want PORT or PORT/tcp or PORT/udp", a)
		}
		r := api.PortRule{Port: n, Protocol: proto, From: from}
		n2 := r
		if err := n2.Normalize(); err != nil {
			return nil, err
		}
		if defaults || r.Protocol != "" {
			r.Protocol = n2.Protocol
		}
		if defaults || r.From != "" {
			r.From = n2.From
		}
		out = append(out, r)
	}
	return out, nil
}

func printPorts(g *globals, res api.PortsResult) error {
	if g.json {
		return g.printJSON(res)
	}
	if len(res.Rules) == 0 {
		fmt.Fprintln(g.stdout, "no rules: kloud and the owner's machines only")
		return nil
	}
	tw := newTable(g.stdout, "PORT", "PROTOCOL", "FROM")
	for _, r := range res.Rules {
		tw.row(strconv.Itoa(r.Port), r.Protocol, r.From)
	}
	tw.flush()
	return nil
}
