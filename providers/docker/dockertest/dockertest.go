// Package dockertest starts a private Docker daemon for tests: its own data root, exec root,
// unix socket, pid file and temporary directory (TMPDIR, for dockerd and the containerd it
// starts: containerd writes its stack dumps there) under a run directory (testutil.RunDir), no
// iptables rules and no default bridge (--iptables=false --ip6tables=false --bridge=none), so
// it never touches the host's daemon, firewall or networks; NewWith(Options{IPTables: true})
// starts one with a stock daemon's iptables management, in the test's own network namespace only
// (bridgefwtest). Start it with Start (one per test binary, from TestMain) or New (one per
// test); it has the kloud machine image from $KLOUD_BASE_IMAGE, imported once into a template in
// the project's cache and linked into every daemon (template.go; Import makes it available
// under another name without the docker provider's entrypoint). Env, CLI, Docker and Containers
// drive it with the docker command line.
//
// Close stops the daemon by its pid, unmounts what it left under its exec root (the netns
// mounts), removes the Linux bridges of the networks made on it, and removes its directory:
// nothing is left.
package dockertest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"golang.org/x/sys/unix"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/providers/bridgefw"
	"github.com/kloud-dev/kloud/providers/bridgefw/bridgefwtest"
	"github.com/kloud-dev/kloud/providers/docker"
)

// Daemon is a private dockerd.
type Daemon struct {
	// Host is the daemon's address (unix:///.../d.sock), for docker.Options.Host and DOCKER_HOST.
	Host string
	// Dir holds everything the daemon writes.
	Dir string
	// Image is the kloud machine image imported into it (docker.ImageRef of $KLOUD_BASE_IMAGE).
	Image  string
	Client *client.Client

	cmd     *exec.Cmd
	exited  chan struct{}
	remove  func()
	bridges []string
}

// Unavailable says why a private daemon cannot run here ("" if it can): root, dockerd and the
// base image are needed.
func Unavailable() string {
	if os.Geteuid() != 0 {
		return "a private dockerd needs root"
	}
	if _, err := exec.LookPath("dockerd"); err != nil {
		return "dockerd is not installed (apt-get install docker.io; scripts/setup.sh does)"
	}
	if os.Getenv("KLOUD_BASE_IMAGE") == "" {
		return "KLOUD_BASE_IMAGE is not set (source /var/cache/kloud/env after scripts/setup.sh as root)"
	}
	return ""
}

// Options change the daemon New and Start start.
type Options struct {
	// IPTables: the daemon manages iptables as a stock dockerd does (its chains, FORWARD policy
	// DROP when it turns on ip_forward, br_netfilter on, a default bridge docker0): only in a
	// network namespace of the test's own (bridgefwtest.StockDockerHost), never on the host.
	IPTables bool
}

// New starts a private daemon for test t (skipped loudly, or failed under CI=true, when
// Unavailable) and closes it when t ends.
func New(t testing.TB) *Daemon { return NewWith(t, Options{}) }

// NewWith is New with options.
func NewWith(t testing.TB, o Options) *Daemon {
	t.Helper()
	if why := Unavailable(); why != "" {
		testutil.Unavailable(t, "%s", why)
	}
	d, err := StartWith(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("dockertest: %v", err)
		}
	})
	return d
}

// Start starts a private daemon and imports the machine image into it. Close it when done.
func Start(ctx context.Context) (*Daemon, error) { return StartWith(ctx, Options{}) }

// StartWith is Start with options.
func StartWith(ctx context.Context, o Options) (*Daemon, error) {
	if why := Unavailable(); why != "" {
		return nil, errors.New(why)
	}
	// The machine image comes linked from the template (imageTemplate); without one, the daemon
	// imports it.
	tpl, err := imageTemplate(ctx)
	if err != nil {
		return nil, err
	}
	return start(ctx, o, tpl)
}

// start starts a daemon whose data root begins as a copy of template tpl ("": empty), and
// imports the machine image unless it is there.
func start(ctx context.Context, o Options, tpl string) (*Daemon, error) {
	if o.IPTables && !bridgefwtest.Inside() {
		return nil, errors.New("dockertest: a daemon managing iptables runs only in a network namespace of the test's own (bridgefwtest.StockDockerHost)")
	}
	dir, remove, err := testutil.RunDir("dockerd")
	if err != nil {
		return nil, err
	}
	d := &Daemon{Dir: dir, remove: remove, Host: "unix://" + filepath.Join(dir, "d.sock"), exited: make(chan struct{})}
	logf, err := os.Create(filepath.Join(dir, "dockerd.log"))
	if err != nil {
		remove()
		return nil, err
	}
	defer logf.Close()
	// dockerd and its containerd write temporary files (containerd.<pid>.stacks.log, when
	// dockerd asks a slow containerd for its stacks before killing it) in TMPDIR: the run's own.
	tmp := filepath.Join(dir, "tmp")
	if err := os.Mkdir(tmp, 0o700); err != nil {
		remove()
		return nil, fmt.Errorf("dockertest: %w", err)
	}
	if tpl != "" {
		if err := seed(tpl, filepath.Join(dir, "data")); err != nil {
			remove()
			return nil, err
		}
	}
	args := []string{"--iptables=false", "--ip6tables=false", "--bridge=none", "--ip-forward=false", "--ip-masq=false"}
	if o.IPTables {
		args = nil // a stock daemon's defaults
	}
	d.cmd = exec.Command("dockerd", append(args,
		"--data-root", filepath.Join(dir, "data"), "--exec-root", filepath.Join(dir, "exec"),
		"-H", d.Host, "--pidfile", filepath.Join(dir, "d.pid"),
		"--shutdown-timeout", "2", "--log-level", "warn")...)
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	d.cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := d.cmd.Start(); err != nil {
		remove()
		return nil, fmt.Errorf("dockertest: start dockerd: %w", err)
	}
	go func() { d.cmd.Wait(); close(d.exited) }()
	if d.Client, err = client.New(client.WithHost(d.Host), client.WithAPIVersionNegotiation()); err != nil {
		d.Close()
		return nil, err
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := d.Client.Ping(pctx, client.PingOptions{})
		cancel()
		if err == nil {
			break
		}
		select {
		case <-d.exited:
			log, _ := os.ReadFile(filepath.Join(dir, "dockerd.log"))
			d.Close()
			return nil, fmt.Errorf("dockertest: dockerd exited: %s", tail(string(log)))
		default:
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "dockerd.log"))
			d.Close()
			return nil, fmt.Errorf("dockertest: dockerd did not answer in 60 s: %v: %s", err, tail(string(log)))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if d.Image, err = docker.ImportImage(ctx, d.Client, os.Getenv("KLOUD_BASE_IMAGE")); err != nil {
		d.Close()
		return nil, fmt.Errorf("dockertest: %w", err)
	}
	return d, nil
}

func tail(s string) string {
	if len(s) > 4000 {
		s = s[len(s)-4000:]
	}
	return s
}

// Log returns the daemon's log.
func (d *Daemon) Log() string {
	b, _ := os.ReadFile(filepath.Join(d.Dir, "dockerd.log"))
	return string(b)
}

// CLI runs the docker command line against the daemon.
func (d *Daemon) CLI(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "docker", args...)
	cmd.Env = append(os.Environ(), "DOCKER_HOST="+d.Host)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("docker %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// Env is the environment entry that points docker (and Vagrant's docker provider) at the daemon.
func (d *Daemon) Env() string { return "DOCKER_HOST=" + d.Host }

// Docker runs the docker command line against the daemon and returns its output; an error
// fails the test. It works in a cleanup too (its context is its own, 2 minutes).
func (d *Daemon) Docker(t testing.TB, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := d.CLI(ctx, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Containers lists the names of all containers of the daemon (running or not), sorted.
func (d *Daemon) Containers(t testing.TB) []string {
	t.Helper()
	out := strings.Fields(d.Docker(t, "ps", "-a", "--format", "{{.Names}}"))
	sort.Strings(out)
	return out
}

// Import makes the Debian base image ($KLOUD_BASE_IMAGE, cloud-init inside) available as image
// name with an entrypoint that only runs the container's command (/usr/bin/env; Image's is the
// docker provider's boot script): what Vagrant's docker provider runs its own command in. It
// does not import the root filesystem a second time (5 s of CPU, 20 s on a loaded host): it
// commits a container of Image, never started, with the entrypoint changed, which shares
// Image's layer. (A commit cannot remove an entrypoint: "ENTRYPOINT []" keeps the image's.)
func (d *Daemon) Import(t testing.TB, name string) {
	t.Helper()
	t0 := time.Now()
	tmp := "dockertest-import-" + strings.NewReplacer(":", "-", "/", "-").Replace(name)
	d.Docker(t, "create", "--name", tmp, d.Image)
	d.Docker(t, "commit", "--change", `ENTRYPOINT ["/usr/bin/env"]`, "--change", "CMD []", tmp, name)
	d.Docker(t, "rm", tmp)
	if ep := strings.TrimSpace(d.Docker(t, "image", "inspect", "-f", "{{json .Config.Entrypoint}}", name)); ep != `["/usr/bin/env"]` {
		t.Fatalf("image %s has entrypoint %s, want [\"/usr/bin/env\"]", name, ep)
	}
	t.Logf("made %s (%s running its command) in %s", name, d.Image, time.Since(t0).Round(time.Millisecond))
}

// Close removes every container and network left on the daemon, stops it (SIGTERM by pid, then
// SIGKILL), unmounts what it left under its directory, deletes the bridges of its networks (and
// the docker provider's firewall tables of them) and removes its directory.
func (d *Daemon) Close() error {
	var errs []error
	if d.Client != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if cs, err := d.Client.ContainerList(ctx, client.ContainerListOptions{All: true}); err == nil {
			for _, c := range cs.Items {
				d.Client.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
			}
		}
		if ns, err := d.Client.NetworkList(ctx, client.NetworkListOptions{}); err == nil {
			for _, n := range ns.Items {
				if n.Driver != "bridge" {
					continue
				}
				br := n.Options["com.docker.network.bridge.name"]
				if br == "" && len(n.ID) >= 12 {
					br = "br-" + n.ID[:12]
				}
				d.bridges = append(d.bridges, br)
				d.Client.NetworkRemove(ctx, n.ID, client.NetworkRemoveOptions{})
			}
		}
		cancel()
		d.Client.Close()
	}
	d.stop()
	// The daemon's containerd shims and containers died with it (no live-restore); what stays
	// is mounts under its directories (exec-root/netns/*, overlay mounts of a crash).
	if err := unmountUnder(d.Dir); err != nil {
		errs = append(errs, err)
	}
	for _, br := range d.bridges {
		// The docker provider's firewall table of the bridge, if a test left it (bridgefw).
		if err := bridgefw.NewTable(br, netip.Prefix{}).Remove(context.Background()); err != nil && os.Geteuid() == 0 {
			errs = append(errs, err)
		}
		if _, err := os.Stat("/sys/class/net/" + br); err == nil {
			if out, err := exec.Command("ip", "link", "delete", br).CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("delete bridge %s: %w: %s", br, err, out))
			}
		}
	}
	if d.remove != nil {
		if err := os.RemoveAll(d.Dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// stop stops dockerd (SIGTERM by pid, SIGKILL after 20 s) and waits until it has exited.
func (d *Daemon) stop() {
	if d.cmd == nil || d.cmd.Process == nil {
		return
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(20 * time.Second):
		d.cmd.Process.Kill()
		<-d.exited
	}
}

// unmountUnder unmounts every mount point under dir, deepest first.
func unmountUnder(dir string) error {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	defer f.Close()
	var mps []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 {
			mp := unescape(fields[4])
			if mp == dir || strings.HasPrefix(mp, dir+"/") {
				mps = append(mps, mp)
			}
		}
	}
	var errs []error
	for i := len(mps) - 1; i >= 0; i-- {
		if err := unix.Unmount(mps[i], unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", mps[i], err))
		}
	}
	return errors.Join(errs...)
}

// unescape decodes mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var c byte
			if _, err := fmt.Sscanf(s[i+1:i+4], "%o", &c); err == nil {
				b.WriteByte(c)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
