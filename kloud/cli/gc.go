package cli

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/provider"
)

// gcCmd is `kloud gc [--dry-run] [--provider NAME]`: gc.run.
func gcCmd(g *globals) *cobra.Command {
	var p api.GCRunParams
	cmd := &cobra.Command{
		Use:   "gc [--dry-run] [--provider NAME]",
		Short: "Remove the providers' resources kloud no longer wants (kloud administrators)",
		Long: `Remove what the providers made for this kloud that kloud no longer wants: resources
(machines, containers) whose stack or machine kloud no longer has, or that the stack's Terraform
state does not hold (a build that died left them). Every resource carries kloud's tags
(kloud.stack, kloud.team, kloud.owner, kloud.machine, kloud.instance); only providers with the
"resources" capability list theirs (kloud provider list), and only this kloud instance's
resources are ever touched. Resources younger than the grace period (kloud serve --gc-grace) and
stacks a job holds are left alone. --dry-run shows what would be removed and why.

kloud serve runs the same sweep every --gc-interval.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			res, err := call(cmd.Context(), g, (*api.Client).GCRun, p)
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(res)
			}
			for _, pr := range res.Providers {
				if pr.Error != "" {
					fmt.Fprintf(g.stdout, "provider %s: %s\n", pr.Name, pr.Error)
				}
			}
			n := 0
			for _, pr := range res.Providers {
				n += pr.Resources
			}
			if len(res.Garbage) == 0 {
				fmt.Fprintf(g.stdout, "no garbage (%d resources of %d providers looked at)\n", n, len(res.Providers))
				return nil
			}
			t := newTable(g.stdout, "PROVIDER", "KIND", "ID", "STACK", "MACHINE", "RESULT", "REASON")
			failed := 0
			for _, it := range res.Garbage {
				r := it.Resource
				result := "removed"
				switch {
				case res.DryRun:
					result = "would remove"
				case it.Error != "":
					result, failed = "failed: "+it.Error, failed+1
				}
				t.row(it.Provider, r.Kind, r.ID, r.Tag(provider.TagStack), r.Tag(provider.TagMachine), result, it.Reason)
			}
			if err := t.flush(); err != nil {
				return err
			}
			if failed > 0 {
				return fmt.Errorf("%d of %d resources could not be removed (see above); the next sweep tries again", failed, len(res.Garbage))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&p.DryRun, "dry-run", false, "show what would be removed and why; remove nothing")
	cmd.Flags().StringVar(&p.Provider, "provider", "", "only this provider's resources")
	return cmd
}

// gcServeFlags adds kloud serve's flags of the garbage collector to fl.
func gcServeFlags(fl *pflag.FlagSet, o *kloud.GCOptions) {
	o.Interval, o.Grace = kloud.DefaultGCInterval, kloud.DefaultGCGrace
	fl.Var(zeroOff{&o.Interval}, "gc-interval", "how often kloud removes the providers' resources it no longer wants (as kloud gc does); 0 disables the sweep")
	fl.Var(zeroOff{&o.Grace}, "gc-grace", "the garbage collector leaves resources younger than this alone (a build may be making them); 0: none")
}

// zeroOff is a duration flag whose 0 is stored as -1 (kloud.GCOptions: negative is "off", zero
// is "the default").
type zeroOff struct{ d *time.Duration }

func (z zeroOff) String() string {
	if z.d == nil {
		return ""
	}
	if *z.d < 0 {
		return "0s"
	}
	return z.d.String()
}

func (z zeroOff) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	if d < 0 {
		return fmt.Errorf("%s: negative", s)
	}
	if d == 0 {
		d = -1
	}
	*z.d = d
	return nil
}

func (z zeroOff) Type() string { return "duration" }
