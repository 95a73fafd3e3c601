package cli

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kontrol/kontrolapi"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/vagrant"
)

// serveVagrant is kloud serve's vagrant provider: machines on the owners' own hosts, built by
// the klient --vagrant each owner runs there (Koding's way). It needs nothing on the kloud host;
// a build says when the owner has no host connected.
type serveVagrant struct {
	noVagrant bool
	v         *vagrant.Vagrant
	hosts     lateHosts
}

func (sv *serveVagrant) flags(cmd *cobra.Command) {
	cmd.Flags().BoolVar(&sv.noVagrant, "no-vagrant", false, "do not offer the vagrant provider (machines on users' own hosts running klient --vagrant)")
}

// register adds the vagrant provider to reg (unless --no-vagrant). Its hosts come from kloud's
// kontrol, which exists only after kloud.New: start binds them.
func (sv *serveVagrant) register(f *serveFlags, reg *provider.Registry, log *slog.Logger) error {
	if sv.noVagrant {
		return nil
	}
	instance, err := instanceID(f.o.DataDir)
	if err != nil {
		return err
	}
	endpoint, err := serviceEndpoint(f.o.Addr)
	if err != nil {
		log.Warn("vagrant provider: terraform cannot reach kloud's vagrant machine service; vagrant stacks cannot be built", "err", err)
	}
	v, err := vagrant.New(vagrant.Options{
		StateDir: filepath.Join(f.o.DataDir, "vagrant"), Hosts: &sv.hosts, Instance: instance,
		Endpoint: endpoint, Logger: log.With("provider", vagrant.Name),
	})
	if err != nil {
		return err
	}
	sv.v = v
	reg.Register(v.Provider())
	return nil
}

// hostNote says whether this host could be a vagrant host too (make run's user usually has one
// machine): what is missing, or the command that makes it one. kloud itself needs neither
// vagrant nor docker: the hosts are the users'.
func (sv *serveVagrant) hostNote(dataDir string) string {
	if sv.v == nil {
		return ""
	}
	const pre = "vagrant provider: machines are built on their owner's own host by `klient --vagrant`; "
	if _, err := exec.LookPath("vagrant"); err != nil {
		return pre + "this host has no vagrant (install it: apt-get install vagrant docker.io) to build vagrant machines here"
	}
	sock := "/var/run/docker.sock"
	if h := os.Getenv("DOCKER_HOST"); strings.HasPrefix(h, "unix://") {
		sock = strings.TrimPrefix(h, "unix://")
	} else if h != "" {
		return pre + "to build here (Vagrant's docker provider, DOCKER_HOST=" + h + "), run: klient --vagrant --kite-key KEY (KEY: kloud key create --username YOU --out KEY)"
	}
	c, err := net.DialTimeout("unix", sock, time.Second)
	if err != nil {
		return pre + "this host has vagrant but no Docker daemon answers at " + sock + " (start dockerd, or set DOCKER_HOST) for Vagrant's docker provider"
	}
	c.Close()
	return pre + "to build on this host, run: klient --vagrant --kite-key KEY (KEY: kloud key create --username YOU --out KEY; the admin's is " + filepath.Join(dataDir, kloud.AdminKeyFile) + ")"
}

// start binds the provider to kloud's kontrol and runs kloud's gc for it (kloud.CollectGarbage:
// the machines of stacks kloud no longer has, and those a crash left half-created, which the
// provider's inventory lists) whenever a vagrant host registers and every sweepInterval: a
// machine can only be removed while its host is connected.
func (sv *serveVagrant) start(ctx context.Context, s *kloud.Server, log *slog.Logger) {
	if sv.v == nil {
		return
	}
	h := vagrant.KontrolHosts(s.Kontrol)
	sv.hosts.h.Store(&h)
	sweep := func() {
		res, err := s.CollectGarbage(ctx, vagrant.Name)
		if err != nil && ctx.Err() == nil {
			log.Warn("vagrant provider: sweep", "err", err)
		}
		for _, g := range res.Garbage {
			if g.Error != "" {
				log.Debug("vagrant provider: sweep: not removed (yet)", "machine", g.Resource.ID, "reason", g.Reason, "err", g.Error)
			}
		}
	}
	go func() {
		tick := time.NewTicker(sweepInterval)
		defer tick.Stop()
		for ctx.Err() == nil {
			events, _, cancel := s.Kontrol.Subscribe(kite.Identity{Name: kontrolapi.VagrantHostName})
			sweep()
		loop:
			for {
				select {
				case ev, ok := <-events:
					if !ok {
						break loop
					}
					if ev.Action == "register" {
						sweep()
					}
				case <-tick.C:
					sweep()
				case <-ctx.Done():
					break loop
				}
			}
			cancel()
		}
	}()
}

// sweepInterval is how often kloud serve sweeps vagrant machines besides host registrations.
const sweepInterval = 2 * time.Minute

// lateHosts is vagrant.Hosts once bound.
type lateHosts struct{ h atomic.Pointer[vagrant.Hosts] }

func (l *lateHosts) Host(ctx context.Context, owner, want string) (*vagrant.Host, error) {
	h := l.h.Load()
	if h == nil {
		return nil, fmt.Errorf("kloud is starting: %w", kite.ErrUnavailable)
	}
	return (*h).Host(ctx, owner, want)
}
