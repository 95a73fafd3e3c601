//go:build release

package cli

import (
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/kloud-dev/kloud/provider"
)

// serveDummy: release builds have no dummy provider (serve_dummy.go).
type serveDummy struct{}

func (d *serveDummy) flags(*cobra.Command) {}

func (d *serveDummy) register(*provider.Registry, string, *slog.Logger) {}
