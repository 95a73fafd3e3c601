package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/bridgefw"
	"github.com/kloud-dev/kloud/providers/local"
	"github.com/kloud-dev/kloud/providers/local/sandbox"
)

// InstanceIDFile in kloud's data dir holds this kloud's instance id, which every local machine it
// creates records: the garbage collector and the local machine service touch only machines of
// their own instance, so several klouds (separate data dirs) can share a host and a state dir.
const InstanceIDFile = "instance-id"

// serveLocal is kloud serve's local provider: machines are Linux namespace machines on this
// host with real cloud-init. It needs root; without it kloud says so at startup and in
// provider.describe.
type serveLocal struct {
	noLocal bool
	o       local.Options
	subnet  string
	l       *local.Local
}

func (sl *serveLocal) flags(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.BoolVar(&sl.noLocal, "no-local", false, "do not offer the local provider")
	fl.StringVar(&sl.o.StateDir, "local-state-dir", "", "where local machines live (default /var/lib/kloud/machines)")
	fl.StringVar(&sl.o.Bridge, "local-bridge", "", "bridge of the local machines (default kd-br0)")
	fl.IntVar(&sl.o.MachinePidsMax, "machine-pids-max", sandbox.DefaultPidsMax, "processes and threads limit of each local machine (its pids cgroup; -1: no limit)")
	fl.StringVar(&sl.subnet, "local-subnet", "", "subnet of the local machines (default 10.200.0.0/24; kloud is .1)")
}

// register adds the local provider to reg (unless --no-local) and sets up its bridge.
func (sl *serveLocal) register(ctx context.Context, f *serveFlags, reg *provider.Registry, log *slog.Logger) error {
	o := &sl.o
	if sl.noLocal {
		return nil
	}
	if sl.subnet != "" {
		p, err := netip.ParsePrefix(sl.subnet)
		if err != nil {
			return fmt.Errorf("--local-subnet: %w", err)
		}
		o.Subnet = p
	}
	o.Logger = log
	var err error
	if o.Instance, err = instanceID(f.o.DataDir); err != nil {
		return err
	}
	if o.Endpoint, err = serviceEndpoint(f.o.Addr); err != nil {
		log.Warn("local provider: terraform cannot reach kloud's local machine service; local stacks cannot be built", "err", err)
	}
	l, err := local.New(*o)
	if err != nil {
		return err
	}
	sl.l = l
	reg.Register(l.Provider())
	if err := l.Available(); err == nil {
		if err := l.SetupNetwork(ctx); err != nil {
			log.Warn("local provider: bridge", "err", err)
		}
		logHostForward(log, "local provider", bridgefw.NewTable(l.Bridge(), netip.Prefix{}).HostForward(ctx))
	}
	return nil
}

// setBuckets gives the local provider's stacks bucket claims on kloud's S3 server (serve_s3.go),
// which its machines reach on their bridge.
func (sl *serveLocal) setBuckets(f *serveFlags, log *slog.Logger) {
	if sl.l == nil {
		return
	}
	if b := f.s3.provisioner(sl.o.Instance, sl.l.KloudURL, log); b != nil {
		sl.l.Provider().Buckets = b
	}
}

// logHostForward says at startup whether the host's firewall would drop traffic between the
// machines on a provider's bridge (br_netfilter on and an iptables FORWARD policy DROP: what a
// stock dockerd leaves) and what kloud did about it (providers/bridgefw hostfw.go): a warning when
// the machines cannot reach each other, a note when kloud's rule keeps them reachable.
func logHostForward(log *slog.Logger, who string, f bridgefw.Forward) {
	switch {
	case f.Blocked():
		log.Warn(who+": "+f.String(), "bridge", f.Bridge)
	case f.Drops():
		log.Info(who+": "+f.String(), "bridge", f.Bridge)
	default:
		log.Debug(who+": "+f.String(), "bridge", f.Bridge)
	}
}

// start tidies, once kloud is built, what a crash left of local machines: half-created machines
// and network leftovers no machine owns. Machines of stacks kloud no longer has are kloud's
// garbage collector's (kloud gc, and the sweep every --gc-interval): the provider lists its
// machines with kloud's tags (provider.CapResources), and only this instance's.
func (sl *serveLocal) start(ctx context.Context, s *kloud.Server, log *slog.Logger) {
	l := sl.l
	if l == nil || l.Available() != nil {
		return
	}
	gone, err := l.Tidy(ctx)
	if err != nil {
		log.Warn("local provider: tidy", "err", err)
	}
	if len(gone) > 0 {
		log.Info("local provider: removed half-created machines", "machines", gone, "instance", l.Instance())
	}
}

var instanceRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// instanceID returns the instance id kept in dataDir, creating it on first start.
func instanceID(dataDir string) (string, error) {
	p := filepath.Join(dataDir, InstanceIDFile)
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(dataDir, 0o700); err != nil {
			return "", fmt.Errorf("data dir: %w", err)
		}
		r := make([]byte, 10)
		rand.Read(r)
		id := "kloud-" + hex.EncodeToString(r)
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err == nil {
			_, err = fmt.Fprintln(f, id)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				os.Remove(p)
				return "", fmt.Errorf("instance id: %w", err)
			}
			return id, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return "", fmt.Errorf("instance id: %w", err)
		}
		b, err = os.ReadFile(p) // another start won the race
	}
	if err != nil {
		return "", fmt.Errorf("instance id: %w", err)
	}
	id := strings.TrimSpace(string(b))
	if !instanceRE.MatchString(id) {
		return "", fmt.Errorf("instance id in %s: %q is not 1-64 of [A-Za-z0-9._-]; remove the file to get a new one (this kloud's local machines then are no longer its own)", p, id)
	}
	return id, nil
}

// serviceEndpoint is kloud's URL as terraform, running on this host in the host's network
// namespace, reaches it: loopback when kloud listens on all interfaces or loopback, else the
// address kloud listens on.
func serviceEndpoint(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("--addr %q: %w", addr, err)
	}
	if port == "" || port == "0" {
		return "", fmt.Errorf("--addr %q: the local machine service needs a fixed port", addr)
	}
	if ip, err := netip.ParseAddr(host); host == "" || (err == nil && (ip.IsUnspecified() || ip.IsLoopback())) {
		host = "127.0.0.1"
		if err == nil && ip.IsLoopback() {
			host = ip.String()
		}
	}
	return "http://" + net.JoinHostPort(host, port), nil
}
