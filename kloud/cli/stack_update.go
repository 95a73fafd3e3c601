package cli

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
)

// kloud stack update and kloud stack scale (issue 13 §1; kloud/stacks_update.go).

func stackUpdateCmds(g *globals) []*cobra.Command {
	var rev int
	var planOnly, detach bool
	var params []string
	update := &cobra.Command{
		Use:   "update STACK [--rev N] [--plan]",
		Short: "Update a built stack to a revision of its template (default: the latest); --plan only shows what it would do",
		Long: `Update a built stack to a revision of its template (default: the latest).

It shows the plan first (planned in a job: its progress on stderr, Ctrl-C cancels it), per
machine: add, change (in place), replace, remove or keep; then runs the update job. Machines that stay keep their disks, agents and terminal sessions; the
update waits for the agents of new and replaced machines only. --plan shows the plan and stops.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			return g.withConn(ctx, func(conn *kite.Conn) error {
				kc := api.NewClient(conn)
				if len(params) > 0 && planOnly {
					return fmt.Errorf("--plan shows a revision's update; with --param the update runs at once (kloud checks the values before any job): leave out one of them")
				}
				if len(params) > 0 { // params.go: new parameter values, checked by kloud before a job
					return g.updateParams(ctx, conn, kc, args[0], rev, params, detach)
				}
				res, err := g.planJobOn(ctx, conn, api.StackPlanParams{StackID: args[0], Rev: rev}) // jobwatch.go
				if err != nil {
					return err
				}
				pctx, cancel := planCallCtx(ctx) // stack.update plans again (stack.go)
				defer cancel()
				if planOnly {
					if g.json {
						return g.printJSON(res.Update)
					}
					return printUpdatePlan(g, res.Update)
				}
				if !g.json {
					if err := printUpdatePlan(g, res.Update); err != nil {
						return err
					}
				}
				ref, err := kc.StackUpdate(pctx, api.StackUpdateParams{StackID: args[0], TemplateRevision: res.Rev})
				if err != nil {
					return explain(err)
				}
				return g.followStackJob(ctx, conn, kc, args[0], ref.JobID, detach)
			})
		},
	}
	update.Flags().IntVar(&rev, "rev", 0, "the template revision to update to (default: the latest)")
	update.Flags().BoolVar(&planOnly, "plan", false, "only show what the update would do")
	update.Flags().StringArrayVar(&params, "param", nil, "name=value: change a parameter of the stack, keeping its revision unless --rev (repeatable; not with --plan)")
	detachFlag(update, &detach)

	var sdetach bool
	scale := &cobra.Command{
		Use:   "scale STACK RESOURCE N",
		Short: "Set the count of a machine resource of a stack and update it (the stack's files then diverge from its template)",
		Long: `Set the count of a machine resource (resource "TYPE" "RESOURCE" { count = ... }) in the
stack's own files, or, if its count is a variable (count = var.NAME), that variable of the
stack, and run the update job: new machines are added, the highest indexes removed. A count
that is another expression cannot be changed this way: edit the template.`,
		Args: cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			n, err := strconv.Atoi(args[2])
			if err != nil {
				return fmt.Errorf("N: %q is not a number", args[2])
			}
			ctx := cmd.Context()
			return g.withConn(ctx, func(conn *kite.Conn) error {
				kc := api.NewClient(conn)
				pctx, cancel := planCallCtx(ctx) // these calls plan (stack.go)
				defer cancel()
				ref, err := kc.StackScale(pctx, api.StackScaleParams{StackID: args[0], Resource: args[1], Count: n})
				if err != nil {
					return explain(err)
				}
				return g.followStackJob(ctx, conn, kc, args[0], ref.JobID, sdetach)
			})
		},
	}
	detachFlag(scale, &sdetach)
	return []*cobra.Command{update, scale}
}

func printUpdatePlan(g *globals, u *api.StackUpdatePlan) error {
	if u == nil {
		return fmt.Errorf("kloud returned no update plan (is it older than this CLI?)")
	}
	from := fmt.Sprintf("revision %d", u.FromRev)
	if u.Diverged {
		from += " (scaled)"
	}
	fmt.Fprintf(g.stdout, "stack %s: %s → revision %d\n", u.StackID, from, u.ToRev)
	tw := newTable(g.stdout, "MACHINE", "ACTION", "CHANGES")
	for _, m := range u.Machines {
		tw.row(m.Label, m.Action, changeText(m))
	}
	if err := tw.flush(); err != nil {
		return err
	}
	var parts []string
	for _, a := range []string{api.UpdateAdd, api.UpdateChange, api.UpdateReplace, api.UpdateRemove, api.UpdateKeep} {
		if n := u.Summary[a]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, a))
		}
	}
	fmt.Fprintf(g.stdout, "%s\n", strings.Join(parts, ", "))
	return nil
}

func changeText(m api.MachineChange) string {
	if m.Action == api.UpdateAdd {
		return attrs(m.Attributes, m.Configured)
	}
	var parts []string
	for _, c := range m.Changes {
		parts = append(parts, c.String())
	}
	return strings.Join(parts, "; ")
}
