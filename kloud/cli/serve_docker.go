package cli

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/docker"
)

// serveDocker is kloud serve's docker provider: machines are containers of the Docker daemon at
// --docker-host (default DOCKER_HOST, else the local socket). kloud offers it whenever it is
// built in; when no daemon answers, kloud says so at startup and in provider.describe.
type serveDocker struct {
	noDocker bool
	o        docker.Options
	subnet   string
	d        *docker.Docker
}

func (sd *serveDocker) flags(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.BoolVar(&sd.noDocker, "no-docker", false, "do not offer the docker provider")
	fl.StringVar(&sd.o.Host, "docker-host", "", "Docker daemon of the docker provider: unix:///path or tcp://host:port (default $DOCKER_HOST, else unix:///var/run/docker.sock)")
	fl.StringVar(&sd.o.Network, "docker-network", "", "Docker network of the docker machines, created by kloud (default "+docker.DefaultNetwork+")")
	fl.StringVar(&sd.o.Bridge, "docker-bridge", "", "Linux bridge of that network (default "+docker.DefaultBridge+")")
	fl.StringVar(&sd.subnet, "docker-subnet", "", "subnet of that network (default "+docker.DefaultSubnet+"; kloud is .1)")
	fl.StringVar(&sd.o.Image, "docker-image", "", "image to run docker machines from (default: imported from $KLOUD_BASE_IMAGE)")
	fl.BoolVar(&sd.o.NoFirewall, "docker-no-firewall", false, "do not filter traffic between docker machines (the firewall capability; on by default where kloud can: a local daemon, root)")
}

// register adds the docker provider to reg (unless --no-docker) and, when the daemon answers,
// creates the machines' network.
func (sd *serveDocker) register(ctx context.Context, f *serveFlags, reg *provider.Registry, log *slog.Logger) error {
	if sd.noDocker {
		return nil
	}
	o := &sd.o
	if sd.subnet != "" {
		p, err := netip.ParsePrefix(sd.subnet)
		if err != nil {
			return fmt.Errorf("--docker-subnet: %w", err)
		}
		o.Subnet = p
	}
	o.Logger = log
	o.StateDir = filepath.Join(f.o.DataDir, "docker")
	var err error
	if o.Instance, err = instanceID(f.o.DataDir); err != nil {
		return err
	}
	if o.Endpoint, err = serviceEndpoint(f.o.Addr); err != nil {
		log.Warn("docker provider: terraform cannot reach kloud's Docker API proxy; docker stacks cannot be built", "err", err)
	}
	d, err := docker.New(*o)
	if err != nil {
		return fmt.Errorf("docker provider: %w", err)
	}
	sd.d = d
	reg.Register(d.Provider())
	if why := d.FirewallUnusable(); why != "" {
		log.Info("docker provider: no firewall between docker machines", "why", why)
	}
	if d.Available() == nil {
		// Made now so that a kloud told to listen on the network's gateway can bind there. It
		// goes with the last container (a destroy, a sweep that removes containers), and builds
		// make it again when they need it (a socket bound to the gateway stays bound meanwhile).
		if err := d.EnsureNetwork(ctx); err != nil {
			log.Warn("docker provider: network", "err", err)
		} else if fwd, ok := d.HostForward(ctx); ok {
			logHostForward(log, "docker provider", fwd)
		}
		// The machine image (about 10 s to import), in the background: a build meanwhile waits
		// for it.
		go func() {
			if ref, err := d.EnsureImage(ctx); err != nil {
				log.Warn("docker provider: machine image", "err", err)
			} else {
				log.Info("docker provider: machine image ready", "image", ref)
			}
		}()
	}
	return nil
}

// start: containers of stacks kloud no longer has are kloud's garbage collector's (kloud gc, and
// the sweep every --gc-interval): the provider lists this instance's containers by their labels
// (provider.CapResources). The firewall follows the daemon's container events while kloud runs
// (docker.Docker.Watch: a container the daemon restarts on its own is reachable again at once).
func (sd *serveDocker) start(ctx context.Context, s *kloud.Server, log *slog.Logger) {
	if sd.d != nil {
		go sd.d.Watch(ctx)
	}
}
