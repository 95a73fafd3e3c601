package cli

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"

	"github.com/spf13/cobra"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/local"
)

// The local provider: machines are Linux namespace machines on this host with real cloud-init.
// It needs root; without it kloud says so at startup and in provider.describe.
func init() {
	var noLocal bool
	var o local.Options
	var subnet string
	var l *local.Local
	serveFlagHooks = append(serveFlagHooks, func(cmd *cobra.Command, f *serveFlags) {
		fl := cmd.Flags()
		fl.BoolVar(&noLocal, "no-local", false, "do not offer the local provider")
		fl.StringVar(&o.StateDir, "local-state-dir", "", "where local machines live (default /var/lib/kloud/machines)")
		fl.StringVar(&o.Bridge, "local-bridge", "", "bridge of the local machines (default kd-br0)")
		fl.StringVar(&subnet, "local-subnet", "", "subnet of the local machines (default 10.200.0.0/24; kloud is .1)")
	})
	providerHooks = append(providerHooks, func(ctx context.Context, cmd *cobra.Command, f *serveFlags, reg *provider.Registry, log *slog.Logger) error {
		if noLocal {
			return nil
		}
		if subnet != "" {
			p, err := netip.ParsePrefix(subnet)
			if err != nil {
				return fmt.Errorf("--local-subnet: %w", err)
			}
			o.Subnet = p
		}
		o.Logger = log
		var err error
		if l, err = local.New(o); err != nil {
			return err
		}
		reg.Register(l.Provider())
		if err := l.Available(); err == nil {
			if err := l.SetupNetwork(ctx); err != nil {
				log.Warn("local provider: bridge", "err", err)
			}
		}
		return nil
	})
	startHooks = append(startHooks, func(ctx context.Context, s *kloud.Server, log *slog.Logger) {
		if l == nil || l.Available() != nil {
			return
		}
		// Startup sweep: machines of stacks kloud no longer has (a crash between terraform and
		// the store, or a data dir reset) are removed.
		gone, err := l.GC(ctx, func(stackID, machineID string) bool {
			n, err := s.Store().Collection(store.CollMachines).CountDocuments(ctx, bson.M{"_id": machineID, "stackId": stackID})
			return err != nil || n > 0 // when in doubt, keep
		})
		if err != nil {
			log.Warn("local provider: sweep", "err", err)
		}
		if len(gone) > 0 {
			log.Info("local provider: removed machines of dead stacks", "machines", gone)
		}
	})
}
