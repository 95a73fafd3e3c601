package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
)

// Typed parameters in the CLI (docs/user-guide.md "Parameters and presets"): kloud template
// parameters lists a template's; stack plan, create and update take --param NAME=VALUE (typed
// by the template's parameter) and plan and create --preset NAME; create asks for required
// parameters without a value when stdin is a terminal.

// paramValues turns --param NAME=VALUE flags into typed JSON values for ps: a string
// parameter's value as it is, any other's as JSON ("4", "true", '["a","b"]'), and as a
// string when it is not JSON (kloud converts "4" to a number, or says what it needs).
func paramValues(flags []string, ps api.TemplateParametersResult) (map[string]json.RawMessage, error) {
	out := map[string]json.RawMessage{}
	for _, kv := range flags {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, fmt.Errorf("--param %q: want name=value", kv)
		}
		p, ok := findParam(ps, k)
		if !ok {
			var names []string
			for _, p := range ps.Parameters {
				names = append(names, p.Name)
			}
			return nil, fmt.Errorf("--param %s: template %s has no parameter %q (its parameters: %s; kloud template parameters %s)", kv, ps.TemplateID, k, strings.Join(names, ", "), ps.TemplateID)
		}
		out[k] = typedValue(p, v)
	}
	return out, nil
}

func typedValue(p api.TemplateParameter, v string) json.RawMessage {
	if p.Type != "string" && p.Type != "any" && json.Valid([]byte(v)) {
		return json.RawMessage(v)
	}
	b, _ := json.Marshal(v)
	return b
}

func findParam(ps api.TemplateParametersResult, name string) (api.TemplateParameter, bool) {
	for _, p := range ps.Parameters {
		if p.Name == name {
			return p, true
		}
	}
	return api.TemplateParameter{}, false
}

// promptParams asks on the terminal for every required parameter p has no value for (neither
// --param, --var nor the preset's), showing its description, choices and default.
func promptParams(in io.Reader, out io.Writer, ps api.TemplateParametersResult, p *api.StackPlanParams) error {
	given := map[string]bool{}
	for k := range p.Parameters {
		given[k] = true
	}
	for k := range p.Variables {
		given[k] = true
	}
	for _, pr := range ps.Presets {
		if p.Preset == nil && pr.Default || p.Preset != nil && *p.Preset == pr.Name {
			for k := range pr.Values {
				given[k] = true
			}
		}
	}
	r := bufio.NewReader(in)
	for _, pp := range ps.Parameters {
		if !pp.Required || given[pp.Name] {
			continue
		}
		label := pp.Name
		if pp.DisplayName != "" {
			label = pp.DisplayName + " (" + pp.Name + ")"
		}
		fmt.Fprintf(out, "%s, %s", label, pp.Type)
		if pp.Description != "" {
			fmt.Fprintf(out, ": %s", pp.Description)
		}
		if len(pp.Choices) > 0 {
			var cs []string
			for _, c := range pp.Choices {
				cs = append(cs, string(c))
			}
			fmt.Fprintf(out, "\n  choices: %s", strings.Join(cs, ", "))
		}
		if pp.Default != nil {
			fmt.Fprintf(out, "\n  default: %s", pp.Default)
		}
		fmt.Fprint(out, "\n> ")
		var v string
		if f, ok := in.(*os.File); ok && pp.Sensitive && term.IsTerminal(int(f.Fd())) {
			b, err := term.ReadPassword(int(f.Fd()))
			fmt.Fprintln(out)
			if err != nil {
				return fmt.Errorf("read %s: %w", pp.Name, err)
			}
			v = string(b)
		} else {
			line, err := r.ReadString('\n')
			if err != nil && line == "" {
				return fmt.Errorf("read %s: %w", pp.Name, err)
			}
			v = strings.TrimRight(line, "\r\n")
		}
		if p.Parameters == nil {
			p.Parameters = map[string]json.RawMessage{}
		}
		p.Parameters[pp.Name] = typedValue(pp, v)
	}
	return nil
}

// withParams fills p's parameters from the --param flags (and, when ask, prompts), looking up
// the template's parameters when there is something to type.
func (g *globals) withParams(ctx context.Context, p *api.StackPlanParams, flags []string, ask bool) error {
	if len(flags) == 0 && !ask {
		return nil
	}
	ps, err := call(ctx, g, (*api.Client).TemplateParameters, api.TemplateGetParams{TemplateID: p.TemplateID, Rev: p.Rev})
	if err != nil {
		return err
	}
	if p.Parameters, err = paramValues(flags, ps); err != nil {
		return err
	}
	if ask {
		return promptParams(os.Stdin, g.stderr, ps, p)
	}
	return nil
}

func templateParametersCmd(g *globals) *cobra.Command {
	var rev int
	cmd := &cobra.Command{
		Use:   "parameters TEMPLATE",
		Short: "List a template's typed parameters and presets",
		Long: `List a template's typed parameters (its variable blocks, with kloud_parameter's display name,
choices, mutability and order) and its presets (kloud_preset). Give values at stack create with
--param NAME=VALUE and --preset NAME.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			res, err := call(cmd.Context(), g, (*api.Client).TemplateParameters, api.TemplateGetParams{TemplateID: args[0], Rev: rev})
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(res)
			}
			tw := newTable(g.stdout, "NAME", "TYPE", "DEFAULT", "REQUIRED", "MUTABLE", "CHOICES", "DESCRIPTION")
			for _, p := range res.Parameters {
				def := string(p.Default)
				if p.Sensitive {
					def = "(sensitive)"
				}
				var cs []string
				for _, c := range p.Choices {
					cs = append(cs, string(c))
				}
				desc := p.Description
				if p.DisplayName != "" {
					desc = strings.TrimSpace(p.DisplayName + ": " + desc)
				}
				tw.row(p.Name, p.Type, def, yesNo(p.Required), yesNo(p.Mutable), strings.Join(cs, ","), desc)
			}
			if err := tw.flush(); err != nil {
				return err
			}
			if len(res.Presets) == 0 {
				return nil
			}
			fmt.Fprintln(g.stdout)
			tw = newTable(g.stdout, "PRESET", "DEFAULT", "VALUES")
			for _, pr := range res.Presets {
				b, _ := json.Marshal(pr.Values)
				tw.row(pr.Name, yesNo(pr.Default), string(b))
			}
			return tw.flush()
		},
	}
	cmd.Flags().IntVar(&rev, "rev", 0, "template revision (default: the current one)")
	return cmd
}

// updateParams runs stack update --param: the values typed by the parameters of the stack's
// template revision (its own unless --rev), checked by kloud before any job (an immutable one
// refused).
func (g *globals) updateParams(ctx context.Context, conn *kite.Conn, kc *api.Client, stackID string, rev int, flags []string, detach bool) error {
	st, err := kc.StackDescribe(ctx, api.StackRef{StackID: stackID})
	if err != nil {
		return explain(err)
	}
	if rev == 0 {
		rev = st.TemplateRev // new values, not a new revision (unless --rev says so)
	}
	ps, err := kc.TemplateParameters(ctx, api.TemplateGetParams{TemplateID: st.TemplateID, Rev: rev})
	if err != nil {
		return explain(err)
	}
	vals, err := paramValues(flags, ps)
	if err != nil {
		return err
	}
	pctx, cancel := planCallCtx(ctx)
	defer cancel()
	ref, err := kc.StackUpdate(pctx, api.StackUpdateParams{StackID: stackID, TemplateRevision: rev, Parameters: vals})
	if err != nil {
		return explain(err)
	}
	return g.followStackJob(ctx, conn, kc, stackID, ref.JobID, detach)
}

// stdinTerminal reports whether the CLI may prompt.
func stdinTerminal() bool { return term.IsTerminal(int(os.Stdin.Fd())) }
