package cli

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/local"
)

// DemoTemplate is the template kloud serve offers on a fresh install: two local machines (and
// DemoBucket).
const DemoTemplate = `# Two machines on this host (local provider: Linux namespaces + real cloud-init).
terraform {
  required_providers {
    kloudlocal = { source = "kloud/kloudlocal" }
  }
}

resource "kloudlocal_machine" "dev" {
  count    = 2
  hostname = "dev-${count.index}"
  memory   = 512
  user_data = <<-EOT
    #!/bin/bash
    echo "Welcome to $(hostname), built by Kloud" > /etc/motd
  EOT
}
`

// DemoBucket is what the demo template adds where the local provider provisions buckets (kloud's
// S3 server runs): a bucket both machines use, whose endpoint and keys their owner's login
// shells find in the environment (docs/buckets.md).
const DemoBucket = `
# A bucket both machines use: their owner's login shells have its endpoint and keys
# (KLOUD_BUCKET_SHARED_*, and AWS_* as it is the stack's only bucket; docs/buckets.md).
resource "kloud_bucket" "shared" {}
`

const demoTitle = "Demo: two local machines"

// serveDemo offers the demo template on a fresh install (unless --no-demo).
type serveDemo struct{ noDemo bool }

func (d *serveDemo) flags(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.BoolVar(&d.noDemo, "no-demo", false, "do not create the demo template")
}

// start creates the demo template (when the local provider is offered) and says how to use it.
func (d *serveDemo) start(ctx context.Context, s *kloud.Server, log *slog.Logger) {
	if d.noDemo {
		return
	}
	p, err := s.Providers().Lookup(local.Name)
	if err != nil {
		return
	}
	tmpl := DemoTemplate
	if p.Can(provider.CapBucket) {
		tmpl += DemoBucket
	}
	id, created, err := s.EnsureTemplate(ctx, demoTitle, map[string]string{"main.tf": tmpl})
	if err != nil {
		log.Warn("demo template", "err", err)
		return
	}
	var b strings.Builder
	if created {
		fmt.Fprintf(&b, "\ncreated the demo template %s (%s)\n", id, demoTitle)
	}
	fmt.Fprintf(&b, "\nTo build the demo stack (two machines on this host), in another terminal:\n")
	fmt.Fprintf(&b, "  bin/kloud stack create --template %s\n  bin/kloud stack apply <the stack id it prints>\n", id)
	fmt.Fprintf(&b, "To use the web UI, set a password, then open %s/ and log in as admin:\n  bin/kloud user passwd admin\n", s.PublicURL())
	if err := p.Available(); err != nil {
		fmt.Fprintf(&b, "NOTE: the local provider cannot run here: %v\n", err)
	}
	fmt.Print(b.String())
}
