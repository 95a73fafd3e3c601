package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"time"

	"github.com/spf13/cobra"

	"github.com/kloud-dev/kloud/internal/version"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/providers/local/sandbox"
)

// errDoctorFailed makes `kloud doctor` exit 1 after it printed its report.
var errDoctorFailed = errors.New("a required check failed")

func doctorCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "doctor",
		Short: "Check a kloud deployment and say what to do about each problem (kloud administrators)",
		Long: `Check the kloud at --url from its side (kloud.doctor) and from this client's, and print each
check with what it found and, for a failure, what to do:

  kloud          kloud answers (this client reaches it, with its key)
  versions       this client's version against the server's, the server's against its terraformer's
  clock          this host's clock against kloud's (at most 2s apart)
  clock.store    kloud's clock against the store's (at most 2s apart)
  store          the store answers (embedded, or --mongo-url)
  store.atomic   concurrent findOneAndUpdate on a scratch document each see their own value
  terraformer    configured, up, answering /healthz and /readyz (with its and terraform's versions)
  provider.NAME  each provider's availability on kloud's host (not required: the others work)
  mirror         the Terraform provider mirror kloud serve's terraformer uses exists
  baseImage      the local provider's base image is built (not required: built on first use)

It exits 1 when a required check fails, 0 otherwise (warnings included); --json prints the checks.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), 2*time.Minute)
			defer cancel()
			checks := runDoctor(ctx, g)
			failed := false
			for _, c := range checks {
				failed = failed || (!c.OK && c.Required)
			}
			if g.json {
				if err := g.printJSON(map[string]any{"ok": !failed, "checks": checks}); err != nil {
					return err
				}
			} else {
				printDoctor(g, checks)
			}
			if failed {
				return errDoctorFailed
			}
			return nil
		},
	}
}

// runDoctor asks kloud.doctor and adds this client's checks.
func runDoctor(ctx context.Context, g *globals) []api.DoctorCheck {
	sent := time.Now()
	res, err := call0(ctx, g, (*api.Client).Doctor)
	got := time.Now()
	if err != nil {
		return []api.DoctorCheck{{Name: "kloud", Required: true, Error: err.Error(),
			Fix: "start kloud (kloud serve), point --url / KLOUD_URL at it, and use an administrator's key (--key, or --data-dir of that kloud)"}}
	}
	out := []api.DoctorCheck{{Name: "kloud", OK: true, Required: true, Detail: "kloud " + res.KloudVersion + " at " + g.url}}
	v := api.DoctorCheck{Name: "versions", OK: res.KloudVersion == version.Version, Detail: "this client " + version.Version + ", kloud " + res.KloudVersion,
		Fix: "use the kloud binary of the server's release"}
	if !v.OK {
		v.Error = "this client and kloud are of different versions"
	}
	out = append(out, v)
	// The server's time against the middle of the round trip.
	skew := res.ServerTime.Sub(sent.Add(got.Sub(sent) / 2))
	c := api.DoctorCheck{Name: "clock", OK: skew.Abs() <= kloud.MaxClockSkew+got.Sub(sent), Detail: fmt.Sprintf("kloud's clock is %s off this host's", skew.Round(time.Millisecond)),
		Fix: "synchronise this host's clock with kloud's (NTP): session and token expiry compare them"}
	if !c.OK {
		c.Error = "clock skew " + skew.Round(time.Millisecond).String()
	}
	out = append(out, c)
	return append(out, res.Checks...)
}

func printDoctor(g *globals, checks []api.DoctorCheck) {
	tw := newTable(g.stdout, "CHECK", "STATUS", "DETAIL")
	for _, c := range checks {
		status, detail := "ok", c.Detail
		if !c.OK {
			status = "warning"
			if c.Required {
				status = "FAILED"
			}
			detail = c.Error
		}
		tw.row(c.Name, status, detail)
	}
	tw.flush()
	for _, c := range checks {
		if !c.OK && c.Fix != "" {
			fmt.Fprintf(g.stdout, "%s: %s\n  fix: %s\n", c.Name, c.Error, c.Fix)
		}
	}
}

// mirrorPathRE finds a filesystem_mirror's path in a Terraform CLI config.
var mirrorPathRE = regexp.MustCompile(`(?s)filesystem_mirror\s*\{[^}]*?path\s*=\s*"([^"]+)"`)

// serveDoctorChecks are kloud serve's checks for kloud.doctor: the provider mirror of the
// terraformer it starts, and the local provider's base image.
func serveDoctorChecks(f *serveFlags) []kloud.DoctorCheck {
	var out []kloud.DoctorCheck
	if len(f.terraformerURLs) == 0 {
		out = append(out, func(context.Context) api.DoctorCheck {
			c := api.DoctorCheck{Name: "mirror", Required: true,
				Fix: "build the offline Terraform provider mirror and its CLI config with scripts/tf-mirror.sh (or scripts/setup.sh), or set TF_CLI_CONFIG_FILE"}
			cfg := tfCLIConfig()
			if cfg == "" {
				cfg = os.Getenv("TF_CLI_CONFIG_FILE")
			}
			if cfg == "" {
				c.Error = "no Terraform CLI config with a provider mirror ($KLOUD_CACHE/terraform.tfrc or TF_CLI_CONFIG_FILE)"
				return c
			}
			b, err := os.ReadFile(cfg)
			if err != nil {
				c.Error = err.Error()
				return c
			}
			m := mirrorPathRE.FindSubmatch(b)
			if m == nil {
				c.OK, c.Detail = true, cfg+" (no filesystem mirror: providers come from where it says)"
				return c
			}
			entries, err := os.ReadDir(string(m[1]))
			switch {
			case err != nil:
				c.Error = fmt.Sprintf("the mirror %s named by %s: %v", m[1], cfg, err)
			case len(entries) == 0:
				c.Error = fmt.Sprintf("the mirror %s named by %s is empty", m[1], cfg)
			default:
				c.OK, c.Detail = true, fmt.Sprintf("%s (from %s)", m[1], cfg)
			}
			return c
		})
	}
	if f.local.l != nil {
		out = append(out, func(context.Context) api.DoctorCheck {
			c := api.DoctorCheck{Name: "baseImage",
				Fix: "build it now with scripts/setup.sh (mmdebstrap, about a minute), or the first local machine waits for it"}
			p, ok := sandbox.CachedBaseImage("")
			if b := f.local.o.BaseImage; b != "" {
				_, err := os.Stat(b)
				p, ok = b, err == nil
			}
			if ok {
				c.OK, c.Detail = true, p
			} else {
				c.Error = "the local provider's base image is not built yet (" + p + ")"
			}
			return c
		})
	}
	return out
}
