package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/provider"
)

// kloud credential add|update|list|describe|remove|authenticate|bootstrap and kloud provider
// describe. Credential fields are checked against the provider's JSON Schema (provider.describe)
// before they are sent; kloud checks them again.

func credentialCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "credential",
		Short: "Manage provider credentials (secrets are stored encrypted and never shown)",
		Long: `A credential holds what a provider needs (keys, regions, ...). It belongs to a team: its
members see it and use it in stacks; its owner and the team's admins update, remove and bootstrap it.
Secret fields are encrypted at rest and never shown again by any command. See each provider's
fields with: kloud provider describe`,
	}
	cmd.AddCommand(credentialAddCmd(g), credentialUpdateCmd(g), credentialListCmd(g), credentialDescribeCmd(g), credentialRemoveCmd(g),
		credentialAuthenticateCmd(g), credentialBootstrapCmd(g))
	return cmd
}

// describeProvider fetches one provider's description.
func describeProvider(ctx context.Context, c *kite.Conn, name string) (*provider.Description, error) {
	res, err := api.NewClient(c).ProviderDescribe(ctx, api.ProviderDescribeParams{Provider: name})
	if err != nil {
		return nil, explain(err)
	}
	if len(res.Providers) != 1 {
		return nil, fmt.Errorf("provider %q not found", name)
	}
	return &res.Providers[0], nil
}

// fieldsData turns --field k=v flags into the provider's JSON, converting each value to its
// field's type in the provider's credential schema (provider.describe). Unknown fields are
// errors naming the fields there are.
func fieldsData(d *provider.Description, kvs []string) (json.RawMessage, error) {
	raw, err := provider.ParseFields(d.Schemas.Credential, kvs)
	if err != nil {
		return nil, fmt.Errorf("--field: %w\n  see the fields with: kloud provider describe %s", err, d.Name)
	}
	return raw, nil
}

// checkCredential validates data against the provider's credential schema before it is sent
// (kloud validates again). With partial (an update's patch), required fields may be missing.
func checkCredential(d *provider.Description, data json.RawMessage, partial bool) error {
	schema := d.Schemas.Credential
	if schema == nil || string(schema) == "null" {
		return nil
	}
	if partial {
		var m map[string]any
		if err := json.Unmarshal(schema, &m); err != nil {
			return fmt.Errorf("provider %s's credential schema: %w", d.Name, err)
		}
		delete(m, "required")
		schema, _ = json.Marshal(m)
		// A null resets a field (credential.update): check only the values given.
		var patch map[string]any
		if json.Unmarshal(data, &patch) == nil {
			for k, v := range patch {
				if v == nil {
					delete(patch, k)
				}
			}
			data, _ = json.Marshal(patch)
		}
	}
	if err := provider.Validate(schema, data); err != nil {
		return fmt.Errorf("%s credential: %w\n  see the fields with: kloud provider describe %s", d.Name, err, d.Name)
	}
	return nil
}

// readData returns the credential data given by --data or --data-file (- for stdin), or nil.
func readData(data, dataFile string) (json.RawMessage, error) {
	switch {
	case data != "":
		return json.RawMessage(data), nil
	case dataFile == "-":
		b, err := io.ReadAll(os.Stdin)
		if err != nil {
			return nil, fmt.Errorf("--data-file: %w", err)
		}
		return b, nil
	case dataFile != "":
		b, err := os.ReadFile(dataFile)
		if err != nil {
			return nil, fmt.Errorf("--data-file: %w", err)
		}
		return b, nil
	}
	return nil, nil
}

func credentialAddCmd(g *globals) *cobra.Command {
	var p api.CredentialAddParams
	var data, dataFile string
	var fields []string
	cmd := &cobra.Command{
		Use:   "add --provider P --title T [--team T] (--data JSON | --data-file F | --field k=v ...)",
		Short: "Add a credential for a provider",
		Long: `Add a credential. Its fields (see kloud provider describe P) come as a JSON object (--data, or
--data-file, - for stdin) or as --field NAME=VALUE flags, converted to the field's type. They are
checked against the provider's schema before they are sent (types, required fields, allowed
values, bounds). Prefer --data-file for secrets: flags end up in your shell history and the
process list. Fields left out take their defaults; required ones must be given. --team defaults
to your only team.

  kloud credential add --provider aws --title prod --data-file aws.json --team red
  kloud credential add --provider dummy --title test --field token=t0k3n --field region=local-2 --field quota=4`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			sources := 0
			for _, set := range []bool{data != "", dataFile != "", len(fields) > 0} {
				if set {
					sources++
				}
			}
			if sources > 1 {
				return errors.New("give the fields one way: --data, --data-file or --field")
			}
			var err error
			if p.Data, err = readData(data, dataFile); err != nil {
				return err
			}
			if len(p.Data) > 0 && !json.Valid(p.Data) {
				return errors.New("the credential data is not valid JSON (want an object of the provider's fields)")
			}
			c, err := g.dial(cmd.Context())
			if err != nil {
				return err
			}
			defer c.Close(nil)
			// The provider's schema checks the fields here first, with the same messages as
			// the server's (which checks again).
			d, err := describeProvider(cmd.Context(), c, p.Provider)
			if err != nil {
				return err
			}
			if len(fields) > 0 {
				if p.Data, err = fieldsData(d, fields); err != nil {
					return err
				}
			}
			if err := checkCredential(d, p.Data, false); err != nil {
				return err
			}
			res, err := api.NewClient(c).CredentialAdd(cmd.Context(), p)
			if err != nil {
				if errors.Is(err, kite.ErrInvalidParams) {
					return fmt.Errorf("%w\n  see the fields with: kloud provider describe %s", err, p.Provider)
				}
				return explain(err)
			}
			if g.json {
				return g.printJSON(res)
			}
			fmt.Fprintf(g.stdout, "added credential %s\ncheck it with: kloud credential authenticate %s\n", res.ID, res.ID)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&p.Provider, "provider", "", "provider name (required; see kloud provider describe)")
	f.StringVar(&p.Title, "title", "", "a name for people (required)")
	f.StringVar(&p.Team, "team", "", "team that shares it (default: your only team)")
	f.StringVar(&data, "data", "", "the fields as a JSON object")
	f.StringVar(&dataFile, "data-file", "", "read the JSON object from this file (- for stdin)")
	f.StringArrayVar(&fields, "field", nil, "a field as NAME=VALUE (repeatable)")
	cmd.MarkFlagRequired("provider")
	cmd.MarkFlagRequired("title")
	return cmd
}

func credentialUpdateCmd(g *globals) *cobra.Command {
	var data, dataFile string
	var fields, unset []string
	cmd := &cobra.Command{
		Use:   "update ID (--field k=v ... | --data JSON | --data-file F) [--unset NAME ...]",
		Short: "Change fields of a credential (its owner or a team admin)",
		Long: `Change some fields of a credential. Only the fields given change: the others, secrets
included, keep their values; --unset NAME resets a field to its default. The new value is checked
against the provider's schema here and by kloud, which also refuses to change a field marked
immutable (see kloud provider describe P) and asks the provider whether the change is allowed.
The credential must be authenticated again afterwards.

  kloud credential update 5f2c... --field quota=8
  kloud credential update 5f2c... --data-file new-keys.json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sources := 0
			for _, set := range []bool{data != "", dataFile != "", len(fields) > 0} {
				if set {
					sources++
				}
			}
			if sources > 1 {
				return errors.New("give the fields one way: --data, --data-file or --field")
			}
			if sources == 0 && len(unset) == 0 {
				return errors.New("nothing to change: give --field NAME=VALUE, --data, --data-file or --unset NAME")
			}
			raw, err := readData(data, dataFile)
			if err != nil {
				return err
			}
			c, err := g.dial(cmd.Context())
			if err != nil {
				return err
			}
			defer c.Close(nil)
			cl := api.NewClient(c)
			v, err := cl.CredentialDescribe(cmd.Context(), api.CredentialRef{CredentialID: args[0]})
			if err != nil {
				return explain(err)
			}
			d, err := describeProvider(cmd.Context(), c, v.Provider)
			if err != nil {
				return err
			}
			if len(fields) > 0 {
				if raw, err = fieldsData(d, fields); err != nil {
					return err
				}
			}
			patch := map[string]any{}
			if len(raw) > 0 {
				if err := json.Unmarshal(raw, &patch); err != nil || patch == nil {
					return errors.New("the credential data is not a JSON object of the fields to change")
				}
			}
			for _, name := range unset {
				// An unknown name is refused as a --field would be.
				if _, err := provider.ParseFields(d.Schemas.Credential, []string{name + "="}); err != nil && strings.Contains(err.Error(), "unknown field") {
					return fmt.Errorf("--unset: %w", err)
				}
				patch[name] = nil
			}
			if raw, err = json.Marshal(patch); err != nil {
				return err
			}
			if err := checkCredential(d, raw, true); err != nil {
				return err
			}
			res, err := cl.CredentialUpdate(cmd.Context(), api.CredentialUpdateParams{CredentialID: args[0], Data: raw})
			if err != nil {
				if errors.Is(err, kite.ErrInvalidParams) {
					return fmt.Errorf("%w\n  see the fields with: kloud provider describe %s", err, v.Provider)
				}
				return explain(err)
			}
			if g.json {
				return g.printJSON(res)
			}
			if len(res.Changed) == 0 {
				fmt.Fprintf(g.stdout, "credential %s unchanged (the values given are the stored ones)\n", res.ID)
				return nil
			}
			fmt.Fprintf(g.stdout, "updated credential %s: %s\ncheck it with: kloud credential authenticate %s\n", res.ID, strings.Join(res.Changed, ", "), res.ID)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&data, "data", "", "the fields to change as a JSON object (null resets one)")
	f.StringVar(&dataFile, "data-file", "", "read the JSON object from this file (- for stdin)")
	f.StringArrayVar(&fields, "field", nil, "a field to change as NAME=VALUE (repeatable)")
	f.StringArrayVar(&unset, "unset", nil, "a field to reset to its default (repeatable)")
	return cmd
}

func bootstrapStatus(b *model.Bootstrap) string {
	if b == nil || b.Status == "" {
		return model.BootstrapNone
	}
	return b.Status
}

func credentialListCmd(g *globals) *cobra.Command {
	var p api.CredentialListParams
	cmd := &cobra.Command{
		Use:   "list [--provider P] [--team T]",
		Short: "List your teams' credentials (no secrets)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			res, err := call(cmd.Context(), g, (*api.Client).CredentialList, p)
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(res.Credentials)
			}
			tw := newTable(g.stdout, "ID", "TITLE", "PROVIDER", "TEAM", "OWNER", "VERIFIED", "BOOTSTRAP", "CREATED")
			for _, c := range res.Credentials {
				verified := yesNo(c.Verified)
				if !c.Verified && c.VerifyErr == "" {
					verified = "not checked"
				}
				tw.row(c.ID, c.Title, c.Provider, c.Team, c.Owner, verified, bootstrapStatus(c.Bootstrap), c.CreatedAt.Local().Format(time.DateTime))
			}
			return tw.flush()
		},
	}
	cmd.Flags().StringVar(&p.Provider, "provider", "", "only this provider's")
	cmd.Flags().StringVar(&p.Team, "team", "", "only this team's")
	return cmd
}

func credentialDescribeCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "describe ID",
		Short: "Show a credential: its fields (secret ones only as set or not), verification, bootstrap",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			v, err := call(cmd.Context(), g, (*api.Client).CredentialDescribe, api.CredentialRef{CredentialID: args[0]})
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(v)
			}
			w := g.stdout
			fmt.Fprintf(w, "id:        %s\ntitle:     %s\nprovider:  %s\nteam:      %s\nowner:     %s\ncreated:   %s\n",
				v.ID, v.Title, v.Provider, v.Team, v.Owner, v.CreatedAt.Local().Format(time.DateTime))
			switch {
			case v.Verified:
				fmt.Fprintln(w, "verified:  yes")
			case v.VerifyErr != "":
				fmt.Fprintf(w, "verified:  no: %s\n", v.VerifyErr)
			default:
				fmt.Fprintf(w, "verified:  not checked (kloud credential authenticate %s)\n", v.ID)
			}
			if b := v.Bootstrap; b != nil && b.Status != model.BootstrapNone {
				fmt.Fprintf(w, "bootstrap: %s", b.Status)
				if len(b.Outputs) > 0 {
					fmt.Fprintf(w, " (outputs: %s)", strings.Join(b.Outputs, ", "))
				}
				if b.JobID != "" {
					fmt.Fprintf(w, ", job %s", b.JobID)
				}
				fmt.Fprintln(w)
				if b.Error != "" {
					fmt.Fprintf(w, "           %s\n", b.Error)
				}
			} else {
				fmt.Fprintln(w, "bootstrap: none")
			}
			fmt.Fprintln(w)
			tw := newTable(w, "FIELD", "LABEL", "TYPE", "VALUE")
			for _, f := range v.Fields {
				val := ""
				switch {
				case f.Secret && f.Set:
					val = "(secret, set)"
				case f.Secret:
					val = "(secret, not set)"
				case f.Value != nil:
					val = fmt.Sprint(f.Value)
				}
				tw.row(f.Name, f.Label, f.Type, val)
			}
			return tw.flush()
		},
	}
}

func credentialRemoveCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "remove ID",
		Short: "Remove a credential (its owner or a team admin)",
		Long: `Remove a credential. Refused while a stack that is not destroyed uses it, or while it has
bootstrap resources (remove those first: kloud credential bootstrap ID --destroy).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			res, err := call(cmd.Context(), g, (*api.Client).CredentialRemove, api.CredentialRef{CredentialID: args[0]})
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(res)
			}
			fmt.Fprintf(g.stdout, "removed credential %s\n", args[0])
			return nil
		},
	}
}

func credentialAuthenticateCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "authenticate ID",
		Short: "Ask the provider whether the credential works (exit status 1 if not)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			res, err := call(cmd.Context(), g, (*api.Client).CredentialAuthenticate, api.CredentialRef{CredentialID: args[0]})
			if err != nil {
				return err
			}
			if g.json {
				if err := g.printJSON(res); err != nil {
					return err
				}
			} else if res.Verified {
				fmt.Fprintf(g.stdout, "credential %s works\n", res.ID)
			}
			if !res.Verified {
				return fmt.Errorf("the provider rejected credential %s: %s\n  remove it and add it again with the right values (kloud credential remove %s)", res.ID, res.Error, res.ID)
			}
			return nil
		},
	}
}

func credentialBootstrapCmd(g *globals) *cobra.Command {
	var destroy, detach bool
	cmd := &cobra.Command{
		Use:   "bootstrap ID [--destroy]",
		Short: "Create (or with --destroy remove) the provider's shared resources for this credential",
		Long: `Apply the provider's bootstrap templates for the credential (shared resources such as a
network, made once per credential and team) and follow the job: a progress bar with Terraform's log
lines (with --json, one JSON event per line). --destroy removes them again. Owner or team admin only.
Stopping the command (Ctrl-C) stops following; the job goes on.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.dial(cmd.Context())
			if err != nil {
				return err
			}
			defer c.Close(nil)
			res, err := api.NewClient(c).CredentialBootstrap(cmd.Context(), api.CredentialBootstrapParams{CredentialID: args[0], Destroy: destroy})
			if err != nil {
				if errors.Is(err, kite.ErrState) && strings.Contains(err.Error(), "terraformer") {
					return fmt.Errorf("%w\n  bootstrapping runs Terraform: start kloud with a terraformer", err)
				}
				return explain(err)
			}
			if res.AlreadyDone {
				if g.json {
					return g.printJSON(res)
				}
				fmt.Fprintf(g.stdout, "credential %s is already bootstrapped (job %s); to redo it, destroy first: kloud credential bootstrap %s --destroy\n", args[0], res.JobID, args[0])
				return nil
			}
			if detach {
				if g.json {
					return g.printJSON(res)
				}
				fmt.Fprintf(g.stdout, "started job %s\n", res.JobID)
				return nil
			}
			if !g.json {
				what := "bootstrap"
				if destroy {
					what = "bootstrap destroy"
				}
				fmt.Fprintf(g.stdout, "%s of credential %s: job %s\n", what, args[0], res.JobID)
			}
			if _, err := g.watchJob(cmd.Context(), c, res.JobID); err != nil {
				return fmt.Errorf("%w\n  see the state with: kloud credential describe %s", err, args[0])
			}
			if !g.json {
				if destroy {
					fmt.Fprintf(g.stdout, "bootstrap resources of %s destroyed\n", args[0])
				} else {
					fmt.Fprintf(g.stdout, "credential %s bootstrapped\n", args[0])
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&destroy, "destroy", false, "destroy the bootstrap resources instead")
	detachFlag(cmd, &detach)
	return cmd
}

func providerCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "provider", Short: "Show the providers this kloud offers"}
	describe := &cobra.Command{
		Use:   "describe [NAME]",
		Short: "Show providers: what they can do, and their credential fields (types, defaults, secrets, allowed values)",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var p api.ProviderDescribeParams
			if len(args) == 1 {
				p.Provider = args[0]
			}
			res, err := call(cmd.Context(), g, (*api.Client).ProviderDescribe, p)
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(res.Providers)
			}
			sort.Slice(res.Providers, func(i, j int) bool { return res.Providers[i].Name < res.Providers[j].Name })
			if len(res.Providers) == 0 {
				fmt.Fprintln(g.stdout, "this kloud offers no providers")
			}
			for i, d := range res.Providers {
				if i > 0 {
					fmt.Fprintln(g.stdout)
				}
				fmt.Fprintf(g.stdout, "%s (machines: %s)", d.Name, d.ResourceType)
				if d.Description != "" {
					fmt.Fprintf(g.stdout, ": %s", d.Description)
				}
				fmt.Fprintln(g.stdout)
				kind := d.Kind
				if d.Version != "" {
					kind += " " + d.Version
				}
				var caps []string
				for _, c := range d.Capabilities {
					caps = append(caps, string(c))
				}
				fmt.Fprintf(g.stdout, "  kind: %s\n  capabilities: %s\n", kind, strings.Join(caps, ", "))
				if !d.Available {
					fmt.Fprintf(g.stdout, "  NOT AVAILABLE on this kloud: %s\n", d.Unavailable)
				}
				printFields(g.stdout, "credential", d.Credential)
				printFields(g.stdout, "bootstrap outputs", d.Bootstrap)
				printConstraints(g.stdout, d.Constraints) // constraints.go
			}
			return nil
		},
	}
	cmd.AddCommand(describe, providerListCmd(g), providerInstallCmd(g)) // list, install: provider.go
	return cmd
}

func printFields(w io.Writer, what string, fs []provider.Field) {
	if len(fs) == 0 {
		fmt.Fprintf(w, "  %s: none\n", what)
		return
	}
	fmt.Fprintf(w, "  %s:\n", what)
	tw := newTable(w, "    FIELD", "LABEL", "TYPE", "SECRET", "REQUIRED", "DEFAULT", "IMMUTABLE", "ALLOWED", "DESCRIPTION")
	for _, f := range fs {
		tw.row("    "+f.Name, f.Label, f.Type, yesNo(f.Secret), yesNo(f.Required), f.Default, yesNo(f.Immutable), allowed(f), f.Description)
	}
	tw.flush()
}

// allowed says which values field f takes beyond its type: an enum, or bounds (length for
// strings).
func allowed(f provider.Field) string {
	if len(f.Enum) > 0 {
		return strings.Join(f.Enum, "|")
	}
	what := ""
	if f.Type == "string" {
		what = " chars"
	}
	switch {
	case f.Min != "" && f.Max != "":
		return f.Min + ".." + f.Max + what
	case f.Min != "":
		return ">= " + f.Min + what
	case f.Max != "":
		return "<= " + f.Max + what
	}
	return ""
}
