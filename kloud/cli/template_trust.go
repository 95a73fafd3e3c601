package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/provider/tmpl"
)

// `kloud template trust` and `kloud template untrust`: a kloud administrator lifts template
// policy rules for one revision of a template (docs/template-policy.md).

func templateTrustCmd(g *globals) *cobra.Command {
	var (
		rev    int
		allow  []string
		reason string
	)
	cmd := &cobra.Command{
		Use:   "trust ID --allow RULE[,RULE] --reason TEXT [--rev N]",
		Short: "Lift template policy rules for one revision of a template (kloud administrators only; audited)",
		Long: `Lift template policy rules for exactly the files of one revision of a template.

Rules: ` + strings.Join(tmpl.PolicyRules, ", ") + `.
A template that breaks a lifted rule can run commands on, or read files of, the host
that runs Terraform. Trust only templates you have read. Any update of the template
makes a new revision, which is not trusted. The trust (who, when, rules, reason) is
kept with the template (kloud template get) and logged by kloud.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var rules []string
			for _, a := range allow {
				for _, r := range strings.Split(a, ",") {
					if r = strings.TrimSpace(r); r != "" {
						rules = append(rules, r)
					}
				}
			}
			if len(rules) == 0 {
				return fmt.Errorf("say which rules to lift with --allow (rules: %s)", strings.Join(tmpl.PolicyRules, ", "))
			}
			if strings.TrimSpace(reason) == "" {
				return fmt.Errorf("--reason is required: it is kept with the trust")
			}
			tr, err := call(cmd.Context(), g, (*api.Client).TemplateTrust, api.TrustParams{TemplateID: args[0], Revision: rev, Rules: rules, Reason: reason})
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(tr)
			}
			fmt.Fprintf(g.stdout, "template %s rev %d trusted by %s: rules %s lifted for these files only\n", args[0], tr.Rev, tr.By, strings.Join(tr.Rules, ", "))
			return nil
		},
	}
	cmd.Flags().IntVar(&rev, "rev", 0, "revision to trust (default: the current one)")
	cmd.Flags().StringSliceVar(&allow, "allow", nil, "rule ids to lift, comma-separated ("+strings.Join(tmpl.PolicyRules, ", ")+")")
	cmd.Flags().StringVar(&reason, "reason", "", "why (required; kept with the trust)")
	return cmd
}

func templateUntrustCmd(g *globals) *cobra.Command {
	var rev int
	cmd := &cobra.Command{
		Use:   "untrust ID [--rev N]",
		Short: "Withdraw the trust of a template's revisions (kloud administrators only)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			res, err := call(cmd.Context(), g, (*api.Client).TemplateUntrust, api.TrustParams{TemplateID: args[0], Revision: rev})
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(res)
			}
			fmt.Fprintf(g.stdout, "template %s: %d trusted revision(s) untrusted\n", args[0], res.Removed)
			return nil
		},
	}
	cmd.Flags().IntVar(&rev, "rev", 0, "revision to untrust (default: every revision)")
	return cmd
}
