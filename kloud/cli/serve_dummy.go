//go:build !release

package cli

import (
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/dummy"
)

// serveDummy is the dummy provider (machines are klient processes on this host), in every
// build but release builds (-tags release; serve_dummy_release.go): development without root
// (docs/admin-guide.md) and the e2e tests use it.
type serveDummy struct{ dir string }

func (d *serveDummy) flags(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&d.dir, "dummy-dir", "", "offer the test provider \"dummy\", whose machines are klient processes under this directory")
}

// register adds the dummy provider to reg when --dummy-dir is set.
func (d *serveDummy) register(reg *provider.Registry, caCert string, log *slog.Logger) {
	if d.dir != "" {
		reg.Register(dummy.New(dummy.Options{Dir: d.dir, CACert: caCert, Logger: log.With("provider", "dummy")}))
	}
}
