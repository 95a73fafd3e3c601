package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
)

// readTemplateFiles reads --file arguments and every *.tf / *.tf.json of --dir.
func readTemplateFiles(files []string, dir string) (map[string]string, error) {
	if dir != "" {
		for _, pat := range []string{"*.tf", "*.tf.json"} {
			m, _ := filepath.Glob(filepath.Join(dir, pat))
			files = append(files, m...)
		}
	}
	out := map[string]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		out[filepath.Base(f)] = string(b)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no template files: pass --file main.tf or --dir DIR (with *.tf or *.tf.json files)")
	}
	return out, nil
}

func templateCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "template", Short: "Manage stack templates (Terraform HCL or JSON, with revisions)"}
	var title, desc, team, dir string
	var files []string
	create := &cobra.Command{
		Use:   "create --title T (--file F ... | --dir D)",
		Short: "Create a template from Terraform files",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fs, err := readTemplateFiles(files, dir)
			if err != nil {
				return err
			}
			t, err := call(cmd.Context(), g, (*api.Client).TemplateCreate, api.TemplateParams{Title: title, Description: desc, Team: team, Files: fs})
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(t)
			}
			fmt.Fprintf(g.stdout, "template %s created (rev %d, providers: %s)\nnext: kloud stack plan --template %s\n", t.ID, t.Rev, strings.Join(t.Providers, ", "), t.ID)
			return nil
		},
	}
	create.Flags().StringVar(&title, "title", "", "title (required)")
	create.Flags().StringVar(&desc, "description", "", "description")
	create.Flags().StringVar(&team, "team", "", "team (default: your only team)")
	create.Flags().StringArrayVar(&files, "file", nil, "a .tf or .tf.json file (repeatable)")
	create.Flags().StringVar(&dir, "dir", "", "a directory of .tf / .tf.json files")
	create.MarkFlagRequired("title")

	var ufiles []string
	var udir, utitle string
	var umax int
	var uidle string
	var ualways bool
	update := &cobra.Command{
		Use:   "update ID [--file F ... | --dir D] [--title T] [--max-machines N] [--idle-timeout D] [--always-on]",
		Short: "Update a template (new files make a new revision)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p := api.TemplateParams{TemplateID: args[0], Title: utitle, MaxMachines: umax, IdleTimeout: uidle}
			if cmd.Flags().Changed("always-on") { // idle.go
				p.AlwaysOn = &ualways
			}
			if len(ufiles) > 0 || udir != "" {
				fs, err := readTemplateFiles(ufiles, udir)
				if err != nil {
					return err
				}
				p.Files = fs
			}
			t, err := call(cmd.Context(), g, (*api.Client).TemplateUpdate, p)
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(t)
			}
			fmt.Fprintf(g.stdout, "template %s is at rev %d\n", t.ID, t.Rev)
			if umax > 0 {
				fmt.Fprintf(g.stdout, "machine cap: %d per stack\n", t.MaxMachines)
			}
			if p.IdleTimeout != "" || p.AlwaysOn != nil {
				fmt.Fprintf(g.stdout, "idle stop of its machines: %s\n", templateIdleText(t.Idle)) // idle.go
			}
			return nil
		},
	}
	update.Flags().StringArrayVar(&ufiles, "file", nil, "a .tf or .tf.json file (repeatable)")
	update.Flags().StringVar(&udir, "dir", "", "a directory of .tf / .tf.json files")
	update.Flags().StringVar(&utitle, "title", "", "new title")
	idleFlags(update, &uidle, &ualways, "its machines") // idle.go
	update.Flags().IntVar(&umax, "max-machines", 0, fmt.Sprintf("the template's cap on machines per stack, in place of kloud serve --max-machines-per-stack (administrators only; 1 to %d)", kloud.MaxMachinesCeiling))

	var rev int
	get := &cobra.Command{
		Use:   "get ID [--rev N]",
		Short: "Show a template and its files",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			t, err := call(cmd.Context(), g, (*api.Client).TemplateGet, api.TemplateGetParams{TemplateID: args[0], Rev: rev})
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(t)
			}
			fmt.Fprintf(g.stdout, "%s  %q  team %s  owner %s  rev %d\n", t.ID, t.Title, t.Team, t.Owner, t.Rev)
			if t.MaxMachines > 0 {
				fmt.Fprintf(g.stdout, "machine cap: %d per stack (set by an administrator)\n", t.MaxMachines)
			}
			for _, tr := range t.Trust {
				fmt.Fprintf(g.stdout, "trusted: rev %d lifts %s (by %s at %s: %s)\n", tr.Rev, strings.Join(tr.Rules, ","), tr.By, tr.At.Format(time.RFC3339), tr.Reason)
			}
			for _, f := range t.Files {
				fmt.Fprintf(g.stdout, "--- %s\n%s\n", f.Name, strings.TrimRight(f.Content, "\n"))
			}
			return nil
		},
	}
	get.Flags().IntVar(&rev, "rev", 0, "an earlier revision")

	var lteam string
	list := &cobra.Command{
		Use:   "list",
		Short: "List your teams' templates",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			res, err := call(cmd.Context(), g, (*api.Client).TemplateList, api.TemplateListParams{Team: lteam})
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(res.Templates)
			}
			tw := newTable(g.stdout, "ID", "TITLE", "TEAM", "OWNER", "REV", "PROVIDERS")
			for _, t := range res.Templates {
				tw.row(t.ID, t.Title, t.Team, t.Owner, fmt.Sprint(t.Rev), strings.Join(t.Providers, ","))
			}
			return tw.flush()
		},
	}
	list.Flags().StringVar(&lteam, "team", "", "only this team")

	del := &cobra.Command{
		Use:   "delete ID",
		Short: "Delete a template (stacks made from it keep their copy)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := call(cmd.Context(), g, (*api.Client).TemplateDelete, api.TemplateRef{TemplateID: args[0]}); err != nil {
				return err
			}
			fmt.Fprintf(g.stdout, "template %s deleted\n", args[0])
			return nil
		},
	}
	cmd.AddCommand(create, update, get, list, del, templateTrustCmd(g), templateUntrustCmd(g))
	cmd.AddCommand(templateParametersCmd(g)) // params.go
	return cmd
}

// planCallTimeout is how long the CLI waits for a call that plans (stack plan, create, update,
// scale, and apply of a built stack): kloud bounds the plan by its own --plan-timeout and
// answers then, so the CLI waits as long as kloud lets such a call run rather than the 30 s of
// other calls.
const planCallTimeout = 10 * time.Minute

func planCallCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, planCallTimeout)
}

// planFlags are the flags of stack plan and stack create.
type planFlags struct {
	template, title string
	rev             int
	creds, vars     []string
	paramFlags      []string // params.go
	preset          string
	cmd             *cobra.Command
}

func (f *planFlags) add(cmd *cobra.Command, create bool) {
	cmd.Flags().StringVar(&f.template, "template", "", "template id (required)")
	cmd.Flags().IntVar(&f.rev, "rev", 0, "template revision (default: the current one)")
	cmd.Flags().StringArrayVar(&f.creds, "credential", nil, "provider=credentialID (default: the team's only credential for each provider)")
	cmd.Flags().StringArrayVar(&f.vars, "var", nil, "name=value for a template variable (repeatable)")
	cmd.Flags().StringArrayVar(&f.paramFlags, "param", nil, "name=value for a template parameter, typed as the template says (repeatable; kloud template parameters ID)")
	cmd.Flags().StringVar(&f.preset, "preset", "", `a preset of the template, applied under --param (default: the template's default preset; "" for none)`)
	f.cmd = cmd
	if create {
		cmd.Flags().StringVar(&f.title, "title", "", "stack title (default: the template's)")
	}
	cmd.MarkFlagRequired("template")
}

func (f *planFlags) params() (api.StackPlanParams, error) {
	p := api.StackPlanParams{TemplateID: f.template, Rev: f.rev, Title: f.title, Credentials: map[string]string{}, Variables: map[string]string{}}
	for _, kv := range f.creds {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return p, fmt.Errorf("--credential %q: want provider=ID", kv)
		}
		p.Credentials[k] = v
	}
	for _, kv := range f.vars {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return p, fmt.Errorf("--var %q: want name=value", kv)
		}
		p.Variables[k] = v
	}
	if f.cmd != nil && f.cmd.Flags().Changed("preset") {
		p.Preset = &f.preset
	}
	return p, nil
}

func stackCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "stack", Short: "Plan, create, build and destroy stacks"}
	var pf planFlags
	plan := &cobra.Command{
		Use:   "plan --template ID",
		Short: "Show the machines a template would create (changes nothing)",
		Long: `Show the machines a template would create (changes nothing): terraform plans the template in
a kloud job (stack.planJob) whose progress and terraform's lines go to stderr; the machines are
printed when it ends. Ctrl-C cancels the plan (terraform stops).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := pf.params()
			if err != nil {
				return err
			}
			if err := g.withParams(cmd.Context(), &p, pf.paramFlags, false); err != nil { // params.go
				return err
			}
			res, err := g.planJob(cmd.Context(), p)
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(res.Machines)
			}
			tw := newTable(g.stdout, "LABEL", "PROVIDER", "ATTRIBUTES")
			for _, m := range res.Machines {
				tw.row(m.Label, m.Provider, attrs(m.Attributes, m.Configured))
			}
			return tw.flush()
		},
	}
	pf.add(plan, false)

	var cf planFlags
	var createDetach bool
	create := &cobra.Command{
		Use:   "create --template ID",
		Short: "Create a stack from a template: one machine per planned machine, not built yet (or one built already, from the template's pool)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := cf.params()
			if err != nil {
				return err
			}
			// params.go: --param typed; required parameters asked for on a terminal.
			if err := g.withParams(cmd.Context(), &p, cf.paramFlags, stdinTerminal() && !g.json); err != nil {
				return err
			}
			ctx, cancel := planCallCtx(cmd.Context())
			defer cancel()
			var res api.StackCreateResult
			err = g.withConn(cmd.Context(), func(conn *kite.Conn) error {
				kc := api.NewClient(conn)
				if res, err = kc.StackCreate(ctx, p); err != nil {
					return explain(err)
				}
				if !res.Claimed || g.json { // with --json: claimed and jobId say it
					return nil
				}
				// A prebuilt stack of the template's pool (kloud pool): built already; its
				// machines are being handed to the caller. Follow that, not a build.
				fmt.Fprintf(g.stdout, "stack %s claimed from the template's pool: built already; its %d machines are being handed to you\n", res.Stack.ID, len(res.Machines))
				return g.followStackJob(cmd.Context(), conn, kc, res.Stack.ID, res.JobID, createDetach)
			})
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(res)
			}
			if res.Claimed {
				return nil
			}
			fmt.Fprintf(g.stdout, "stack %s created with %d machines\n", res.Stack.ID, len(res.Machines))
			printMachines(g, res.Machines)
			fmt.Fprintf(g.stdout, "next: kloud stack apply %s\n", res.Stack.ID)
			return nil
		},
	}
	cf.add(create, true)
	create.Flags().BoolVar(&createDetach, "detach", false, "a stack claimed from a pool: return without following its handover")

	apply := func(destroy bool) *cobra.Command {
		use, short := "apply STACK", "Build a stack and wait until every machine's agent answers"
		if destroy {
			use, short = "destroy STACK", "Destroy a stack: its machines and their resources"
		}
		var detach bool
		c := &cobra.Command{
			Use:   use,
			Short: short,
			Args:  cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				return g.withConn(cmd.Context(), func(conn *kite.Conn) error {
					kc := api.NewClient(conn)
					// stack.apply of a built stack plans (an update to its own files) before it
					// answers: it waits as long as the other calls that plan.
					pctx, cancel := planCallCtx(cmd.Context())
					res, err := kc.StackApply(pctx, api.StackApplyParams{StackID: args[0], Destroy: destroy})
					cancel()
					if err != nil {
						return explain(err)
					}
					if destroy {
						_, err := g.followJob(cmd.Context(), conn, res.JobID, detach)
						return err
					}
					return g.followStackJob(cmd.Context(), conn, kc, args[0], res.JobID, detach)
				})
			},
		}
		detachFlag(c, &detach)
		return c
	}

	var all bool
	var team string
	list := &cobra.Command{
		Use:   "list",
		Short: "List your stacks",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			res, err := call(cmd.Context(), g, (*api.Client).StackList, api.StackListParams{Team: team, All: all})
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(res.Stacks)
			}
			tw := newTable(g.stdout, "ID", "TITLE", "OWNER", "STATE", "MACHINES", "REASON")
			for _, s := range res.Stacks {
				tw.row(s.ID, s.Title, s.Owner, s.State, fmt.Sprint(len(s.Machines)), firstLine(s.Reason))
			}
			return tw.flush()
		},
	}
	list.Flags().BoolVar(&all, "all", false, "every member's stacks (team admins, with --team; kloud admins)")
	list.Flags().StringVar(&team, "team", "", "only this team")

	describe := &cobra.Command{
		Use:   "describe STACK",
		Short: "Show a stack and its machines",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := call(cmd.Context(), g, (*api.Client).StackDescribe, api.StackRef{StackID: args[0]})
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(st)
			}
			fmt.Fprintf(g.stdout, "stack %s %q  owner %s  team %s  state %s\n", st.ID, st.Title, st.Owner, st.Team, st.State)
			if st.Reason != "" {
				fmt.Fprintf(g.stdout, "reason: %s\n", st.Reason)
			}
			if st.UpdateAvailable {
				fmt.Fprintf(g.stdout, "update available: revision %d → %d (kloud stack update %s --plan)\n", st.TemplateRev, st.LatestRev, st.ID)
			}
			for _, r := range st.Resets {
				fmt.Fprintf(g.stdout, "reset: %s by %s from %s to %s: %s\n", r.At.Local().Format(time.DateTime), r.By, r.From, r.To, r.Reason)
			}
			printMachines(g, st.MachineDocs)
			return nil
		},
	}
	var resetState, resetReason string
	reset := &cobra.Command{
		Use:   "reset STACK [--state Failed|NotInitialized] --reason TEXT",
		Short: "Force a stuck stack and its machines out of any state (kloud administrators; audited)",
		Long: `Force a stack whose job is over out of any state: to Failed (machines in a transition
become Unknown), from where it can be built again or destroyed, or to NotInitialized if nothing
was ever built. Refused while a job of the stack or its machines runs: cancel it first. The
reason, who and when are kept on the stack (kloud stack describe) and logged.

kloud does this by itself for stacks whose job ended without its bookkeeping (its reconciler
runs at startup and every 30s); reset is for what it cannot judge.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := call(cmd.Context(), g, (*api.Client).StackReset, api.StackResetParams{StackID: args[0], State: resetState, Reason: resetReason})
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(st)
			}
			fmt.Fprintf(g.stdout, "stack %s is %s\nreason: %s\n", st.ID, st.State, st.Reason)
			printMachines(g, st.MachineDocs)
			return nil
		},
	}
	reset.Flags().StringVar(&resetState, "state", model.StackFailed, "the state to reset to: Failed or NotInitialized")
	reset.Flags().StringVar(&resetReason, "reason", "", "why (required; kept on the stack and logged)")
	reset.MarkFlagRequired("reason")
	cmd.AddCommand(plan, create, apply(false), apply(true), list, describe, reset)
	cmd.AddCommand(stackUpdateCmds(g)...) // stack_update.go
	return cmd
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

func printMachines(g *globals, ms []model.Machine) {
	tw := newTable(g.stdout, "MACHINE", "LABEL", "PROVIDER", "STATE", "AGENT", "IP", "REASON", "IDLE")
	for _, m := range ms {
		agent := m.Agent.Status
		if !m.Agent.LastSeen.IsZero() {
			agent += " (" + m.Agent.LastSeen.Local().Format(time.TimeOnly) + ")"
		}
		tw.row(m.ID, m.Label, m.Provider, string(m.State), agent, m.IPAddress, firstLine(m.Reason), idleText(m, time.Now()))
	}
	tw.flush()
}

// withConn dials kloud, runs fn on the connection and closes it.
func (g *globals) withConn(ctx context.Context, fn func(c *kite.Conn) error) error {
	c, err := g.dial(ctx)
	if err != nil {
		return err
	}
	defer c.Close(nil)
	return fn(c)
}

// onMachine dials kloud, resolves the machine argument arg (an id, or a label within --stack)
// and runs fn with the connection and the machine's id. An empty arg (an optional machine the
// user left out) gives an empty id.
func (g *globals) onMachine(ctx context.Context, arg, stack string, fn func(c *kite.Conn, id string) error) error {
	return g.withConn(ctx, func(c *kite.Conn) error {
		if arg == "" {
			return fn(c, "")
		}
		id, err := g.resolveMachine(ctx, c, arg, stack)
		if err != nil {
			return err
		}
		return fn(c, id)
	})
}

// resolveMachine accepts a machine id or a label (unique among your machines, or within --stack).
func (g *globals) resolveMachine(ctx context.Context, c *kite.Conn, arg, stack string) (string, error) {
	res, err := api.NewClient(c).MachineList(ctx, api.MachineListParams{StackID: stack})
	if err != nil {
		return "", explain(err)
	}
	var found []string
	for _, m := range res.Machines {
		if m.ID == arg {
			return m.ID, nil
		}
		if m.Label == arg {
			found = append(found, m.ID)
		}
	}
	switch len(found) {
	case 1:
		return found[0], nil
	case 0:
		return "", fmt.Errorf("no machine %q among yours: see `kloud machine list`", arg)
	}
	return "", fmt.Errorf("%d machines are labelled %q: pass its id or --stack", len(found), arg)
}

func machineCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "machine", Short: "List, inspect, start and stop machines"}
	var stack, team string
	list := &cobra.Command{
		Use:   "list",
		Short: "List your machines (and those shared with you)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			res, err := call(cmd.Context(), g, (*api.Client).MachineList, api.MachineListParams{StackID: stack, Team: team})
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(res.Machines)
			}
			printMachines(g, res.Machines)
			return nil
		},
	}
	list.Flags().StringVar(&stack, "stack", "", "only this stack's machines")
	list.Flags().StringVar(&team, "team", "", "every machine of this team (team admins)")

	var istack string
	info := &cobra.Command{
		Use:   "info MACHINE",
		Short: "Show a machine, asking its provider for the real state",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var mi api.MachineInfo
			err := g.onMachine(cmd.Context(), args[0], istack, func(c *kite.Conn, id string) error {
				var err error
				mi, err = api.NewClient(c).MachineInfo(cmd.Context(), api.MachineRef{MachineID: id})
				return err
			})
			if err != nil {
				return explain(err)
			}
			if g.json {
				return g.printJSON(mi)
			}
			fmt.Fprintf(g.stdout, "machine %s (%s) of stack %s, provider %s\n", mi.ID, mi.Label, mi.StackID, mi.Provider)
			fmt.Fprintf(g.stdout, "state:  %s (provider says %s)\n", mi.State, mi.InfraState)
			fmt.Fprintf(g.stdout, "agent:  %s, kite %s\n", mi.Agent.Status, mi.KiteID)
			if mi.IPAddress != "" {
				fmt.Fprintf(g.stdout, "ip:     %s\n", mi.IPAddress)
			}
			if mi.Reason != "" {
				fmt.Fprintf(g.stdout, "reason: %s\n", mi.Reason)
			}
			fmt.Fprintf(g.stdout, "idle:   %s\n", idleText(mi.Machine, time.Now())) // idle.go
			if mi.Autostart != nil {
				fmt.Fprintf(g.stdout, "autostart: %s\n", autostartText(mi.Autostart))
			}
			if mi.InfoError != "" {
				fmt.Fprintf(g.stdout, "the provider could not be asked: %s\n", mi.InfoError)
			}
			printAttributes(g, mi.Attributes)
			return nil
		},
	}
	info.Flags().StringVar(&istack, "stack", "", "the machine's stack (when labels repeat)")

	power := func(method string) *cobra.Command {
		var pstack string
		var detach bool
		c := &cobra.Command{
			Use:   method + " MACHINE",
			Short: map[string]string{"start": "Start a stopped machine and wait for its agent", "stop": "Stop a running machine (its disk is kept)"}[method],
			Args:  cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				return g.onMachine(cmd.Context(), args[0], pstack, func(conn *kite.Conn, id string) error {
					do := (*api.Client).MachineStart
					if method == "stop" {
						do = (*api.Client).MachineStop
					}
					res, err := do(api.NewClient(conn), cmd.Context(), api.MachineRef{MachineID: id})
					if err != nil {
						return explain(err)
					}
					_, err = g.followJob(cmd.Context(), conn, res.JobID, detach)
					return err
				})
			},
		}
		c.Flags().StringVar(&pstack, "stack", "", "the machine's stack (when labels repeat)")
		detachFlag(c, &detach)
		return c
	}
	shareCmd := func(unshare bool) *cobra.Command {
		var sstack, grant string
		use, short := "share MACHINE USER --grant readonly|terminal|full", "Share a machine: readonly (watch), terminal (a shell as their own account), full (anything the owner can do)"
		if unshare {
			use, short = "unshare MACHINE USER", "Stop sharing a machine with a user (their terminals close at once)"
		}
		c := &cobra.Command{
			Use:   use,
			Short: short,
			Args:  cobra.ExactArgs(2),
			RunE: func(cmd *cobra.Command, args []string) error {
				var res api.SharesResult
				err := g.onMachine(cmd.Context(), args[0], sstack, func(conn *kite.Conn, id string) error {
					do, p := (*api.Client).MachineShare, api.ShareParams{MachineID: id, Username: args[1], Grant: grant}
					if unshare {
						do, p.Grant = (*api.Client).MachineUnshare, ""
					}
					var err error
					res, err = do(api.NewClient(conn), cmd.Context(), p)
					return err
				})
				if err != nil {
					return explain(err)
				}
				if g.json {
					return g.printJSON(res)
				}
				printShares(g, res, true)
				return nil
			},
		}
		c.Flags().StringVar(&sstack, "stack", "", "the machine's stack (when labels repeat)")
		if !unshare {
			c.Flags().StringVar(&grant, "grant", model.GrantTerminal, "readonly, terminal or full")
			c.Long = `Share a machine with a kloud user. What they get on this machine, and only on it:

  readonly  watch the machine's terminals live; cannot type.
  terminal  terminals of their own: a shell as their OWN account on the machine (created
            for them, home under /home, no sudo), so root-only files such as the machine's
            agent key stay out of reach; they can watch the owner's terminals, not type in them.
  full      can do anything the owner can do on this machine: shells as the owner's
            account (with sudo), typing into any terminal, start and stop. Only for people
            you would give the owner's account.

Only the owner (or a team admin) shares; unshare closes the user's terminals at once.`
		}
		return c
	}
	var shstack string
	shares := &cobra.Command{
		Use:   "shares MACHINE",
		Short: "List who a machine is shared with",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var res api.SharesResult
			err := g.onMachine(cmd.Context(), args[0], shstack, func(conn *kite.Conn, id string) error {
				var err error
				res, err = api.NewClient(conn).MachineShares(cmd.Context(), api.MachineRef{MachineID: id})
				return err
			})
			if err != nil {
				return explain(err)
			}
			if g.json {
				return g.printJSON(res)
			}
			printShares(g, res, false)
			return nil
		},
	}
	shares.Flags().StringVar(&shstack, "stack", "", "the machine's stack (when labels repeat)")
	cmd.AddCommand(list, info, power("start"), power("stop"), shareCmd(false), shareCmd(true), shares)
	cmd.AddCommand(machineSetCmd(g))          // idle.go
	cmd.AddCommand(machineSnapshotCmds(g)...) // snapshot.go
	cmd.AddCommand(machinePortsCmd(g))        // ports.go
	cmd.AddCommand(machineUpgradeAgentCmd(g)) // agent.go
	return cmd
}

func printShares(g *globals, res api.SharesResult, changed bool) {
	tw := newTable(g.stdout, "USER", "GRANT")
	for _, s := range res.Shares {
		tw.row(s.Username, s.Grant)
	}
	tw.flush()
	if changed && !res.Pushed {
		fmt.Fprintln(g.stdout, "(the machine's agent is not connected: it gets the list when it connects)")
	}
}

func jobCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "job", Short: "Follow and inspect long-running jobs"}
	watch := &cobra.Command{
		Use:   "watch JOB",
		Short: "Follow a job to its end",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withConn(cmd.Context(), func(c *kite.Conn) error {
				_, err := g.watchJob(cmd.Context(), c, args[0])
				return err
			})
		},
	}
	get := &cobra.Command{
		Use:   "get JOB",
		Short: "Show a job's last state and log",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			j, err := call(cmd.Context(), g, (*api.Client).JobGet, api.JobRef{JobID: args[0]})
			if err != nil {
				return err
			}
			return g.printJSON(j)
		},
	}
	var target string
	list := &cobra.Command{
		Use:   "list",
		Short: "List your recent jobs",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			res, err := call(cmd.Context(), g, (*api.Client).JobList, api.JobListParams{Target: target})
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(res.Jobs)
			}
			tw := newTable(g.stdout, "JOB", "KIND", "TARGET", "STATUS", "%", "CREATED", "ERROR")
			for _, j := range res.Jobs {
				tw.row(j.ID, j.Kind, j.Target, string(j.Status), fmt.Sprint(j.Percent), j.CreatedAt.Local().Format(time.DateTime), firstLine(j.Error))
			}
			return tw.flush()
		},
	}
	list.Flags().StringVar(&target, "target", "", "only jobs of this target, e.g. stack/ID")
	cancel := &cobra.Command{
		Use:   "cancel JOB",
		Short: "Ask a running job to stop",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := call(cmd.Context(), g, (*api.Client).JobCancel, api.JobRef{JobID: args[0]}); err != nil {
				return err
			}
			fmt.Fprintf(g.stdout, "cancel requested for job %s\n", args[0])
			return nil
		},
	}
	cmd.AddCommand(watch, get, list, cancel)
	return cmd
}
