//go:build !release

package cli

import (
	"context"
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/dummy"
)

// The dummy provider (machines are klient processes on this host) is in every build but
// release builds (-tags release): the README's first walk-through and the e2e tests use it.
func init() {
	var dir string
	serveFlagHooks = append(serveFlagHooks, func(cmd *cobra.Command, f *serveFlags) {
		cmd.Flags().StringVar(&dir, "dummy-dir", "", "offer the test provider \"dummy\", whose machines are klient processes under this directory")
	})
	providerHooks = append(providerHooks, func(ctx context.Context, cmd *cobra.Command, f *serveFlags, reg *provider.Registry, log *slog.Logger) error {
		if dir != "" {
			reg.Register(dummy.New(dummy.Options{Dir: dir, Logger: log.With("provider", "dummy")}))
		}
		return nil
	})
}
