package pluginhost

// # The launcher
//
// Every regular, executable file `kloud-provider-NAME` of Options.Dir (kloud's
// Options.PluginDir, default <data dir>/plugins) is a plugin kloud runs. The directory is
// rescanned every LaunchOptions.Rescan (2 s): a new binary is started, a replaced one (other size, mtime or
// inode) restarted, a removed one stopped. So `kloud provider install` only copies the binary
// there (atomically: a temporary name, then a rename). The directory and the binaries must be
// writable only by kloud's user (or root), or nothing in them is launched.
//
// Each plugin runs through internal/sandbox, the launcher terraform runs through too: this
// kloud binary re-executed (cmd/kloud's main calls sandbox.MaybeRun), which starts the
// plugin as LaunchOptions.UID/GID (default 65534, nobody) with no capabilities, in its own pid,
// mount, ipc and uts namespaces, seeing only the system's read-only directories, the plugin
// binary's directory (read-only) and its own state directory <data dir>/plugin-state/NAME
// (read-write, owned by that uid), with terminals of its own (a private devpts: the example
// provider's machines serve web terminals): not kloud's data directory, keys or store. Its
// environment is only PATH and
//
//	KLOUD_PLUGIN_URL        kloud's kite endpoint on loopback (ws://127.0.0.1:PORT/kite)
//	KLOUD_PLUGIN_KEY        a plugin key for NAME, minted for this start, expiring in 24 h
//	KLOUD_PLUGIN_STATE_DIR  its state directory
//
// Its stdout and stderr lines go to kloud's log with provider=NAME. When it exits it is started
// again after a backoff (0.2 s doubling to 30 s, back to 0.2 s after 10 s up); the exit, its
// cause and the last lines it printed are the provider's lastError (provider.list). At shutdown
// every plugin gets SIGTERM, then SIGKILL after 5 s; the launcher dies with kloud (Pdeathsig),
// and everything in a plugin's pid namespace dies with it.
//
// Privileges: an administrator who runs `kloud serve` may let named plugins run without the
// sandbox, with kloud's own privileges (`--plugin-unsandboxed NAME`, for a provider that needs
// the host, e.g. a hypervisor's socket); kloud logs it at WARN at every start of that plugin and
// provider.list shows it in `where`. Without root, kloud cannot build the sandbox: plugins are
// not started and their lastError says so, unless kloud runs with --plugin-insecure-no-sandbox
// (development only: every plugin then runs with kloud's privileges). There is no silent
// fallback.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kloud-dev/kloud/internal/cgroups"
	"github.com/kloud-dev/kloud/internal/sandbox"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/provider/plugin"
)

// Prefix starts the file name of every plugin binary: kloud-provider-NAME.
const Prefix = "kloud-provider-"

// Defaults of LaunchOptions.
const (
	DefaultRescan     = 2 * time.Second
	DefaultMinBackoff = 200 * time.Millisecond
	DefaultMaxBackoff = 30 * time.Second
	DefaultResetAfter = 10 * time.Second // a plugin up this long is not crash-looping
	DefaultStopGrace  = 5 * time.Second
	DefaultKeyTTL     = 24 * time.Hour
)

// LaunchOptions configure the plugin launcher (kloud.Options.Plugins). Zero fields take the
// defaults above.
type LaunchOptions struct {
	// NoLaunch: do not scan the plugin directory (kloud.Options.PluginDir) or start anything
	// (remote plugins may still register).
	NoLaunch bool
	// Insecure starts every plugin without the sandbox, with kloud's privileges (kloud serve
	// --plugin-insecure-no-sandbox; development without root only).
	Insecure bool
	// Unsandboxed names plugins an administrator allows to run without the sandbox, with kloud's
	// privileges (kloud serve --plugin-unsandboxed NAME); logged at WARN at every start.
	Unsandboxed []string
	// UID and GID sandboxed plugins run as (default sandbox.DefaultUID/GID, 65534).
	UID, GID int
	// Limits, if set, run each sandboxed plugin (and what it starts) in a cgroup of its own,
	// kloud/kp-plugin-NAME-..., with these cpu, memory and pids limits; removed when it exits,
	// and those a killed kloud left at start. Nil: none. kloud serve: --plugin-cpus,
	// --plugin-memory-mb, --plugin-pids-max (default sandbox.DefaultPluginLimits).
	Limits *cgroups.Limits
	// Rescan is how often the plugin directory is read again (default 2s).
	Rescan time.Duration
	// MinBackoff, MaxBackoff: the wait before restarting a plugin that exited, doubling from
	// MinBackoff (0.2s) up to MaxBackoff (30s); after ResetAfter (10s) up, MinBackoff again.
	MinBackoff, MaxBackoff, ResetAfter time.Duration
	// StopGrace is how long a plugin has to exit after SIGTERM before SIGKILL (default 5s).
	StopGrace time.Duration
	// KeyTTL is the lifetime of the plugin key a launched plugin gets (default 24h; each start
	// gets a fresh one).
	KeyTTL time.Duration
}

func (o *LaunchOptions) defaults() {
	if o.UID <= 0 {
		o.UID = sandbox.DefaultUID
	}
	if o.GID <= 0 {
		o.GID = sandbox.DefaultGID
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.Rescan, DefaultRescan)
	def(&o.MinBackoff, DefaultMinBackoff)
	def(&o.MaxBackoff, DefaultMaxBackoff)
	def(&o.ResetAfter, DefaultResetAfter)
	def(&o.StopGrace, DefaultStopGrace)
	def(&o.KeyTTL, DefaultKeyTTL)
}

// launcher starts and supervises the plugins of the plugin directory.
type launcher struct {
	h        *Host
	log      *slog.Logger
	plugins  *plugin.Host
	o        LaunchOptions
	dir      string // the plugin binaries
	stateDir string // <data dir>/plugin-state
	url      string // kloud's kite URL on loopback

	mu      sync.Mutex
	running map[string]*launched // by provider name
	refused map[string]string    // name → the file identity last refused (logged once)
}

// launched is one supervised plugin binary.
type launched struct {
	name, bin string
	id        string        // the binary's identity when started (size, mtime, inode)
	stop      chan struct{} // closed to stop it
	done      chan struct{} // closed once it and its supervisor are gone

	mu  sync.Mutex
	pid int
}

func (p *launched) setPID(pid int) {
	p.mu.Lock()
	p.pid = pid
	p.mu.Unlock()
}

func (l *launcher) pid(name string) int {
	l.mu.Lock()
	p := l.running[name]
	l.mu.Unlock()
	if p == nil {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pid
}

// Run launches and supervises the plugin directory's plugins until ctx ends, then stops them
// all and returns once none is left (Done is closed then). With LaunchOptions.NoLaunch it
// returns at once. Call it once, after SetKiteURL.
func (h *Host) Run(ctx context.Context) {
	h.mu.Lock()
	if h.ran { // a second Run has nothing to do (and Done is closed once)
		h.mu.Unlock()
		return
	}
	h.ran = true
	h.mu.Unlock()
	defer close(h.done)
	if h.o.Launch.NoLaunch {
		return
	}
	h.mu.Lock()
	l := &launcher{h: h, log: h.log, plugins: h.plugins, o: h.o.Launch, dir: h.o.Dir, stateDir: h.o.StateDir,
		url: h.kiteURL, running: map[string]*launched{}, refused: map[string]string{}}
	h.l = l
	h.mu.Unlock()
	if err := os.MkdirAll(l.dir, 0o755); err != nil {
		l.log.ErrorContext(ctx, "plugin directory: no provider plugin will be launched", "dir", l.dir, "err", err)
		return
	}
	l.log.InfoContext(ctx, "provider plugins", "dir", l.dir, "sandbox", !l.o.Insecure, "unsandboxed", l.o.Unsandboxed, "limits", l.o.Limits)
	if l.o.Limits != nil && !l.o.Insecure {
		if removed, err := sandbox.RemoveLeftovers(sandbox.CgroupPrefixPlugin); len(removed) > 0 || err != nil {
			l.log.InfoContext(ctx, "removed the cgroups of plugins a killed kloud left", "cgroups", removed, "err", err)
		}
	}
	if l.o.Insecure {
		l.log.WarnContext(ctx, "provider plugins run WITHOUT their sandbox (--plugin-insecure-no-sandbox): third-party code runs with kloud's privileges and sees its data directory; development only")
	}
	tick := time.NewTicker(l.o.Rescan)
	defer tick.Stop()
	for {
		l.scan()
		select {
		case <-ctx.Done():
			l.stopAll()
			return
		case <-tick.C:
		}
	}
}

// fileID identifies a binary's content well enough to notice a replacement.
func fileID(fi os.FileInfo) string {
	id := fmt.Sprintf("%d/%d", fi.Size(), fi.ModTime().UnixNano())
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		id += fmt.Sprintf("/%d:%d", st.Dev, st.Ino)
	}
	return id
}

// trusted checks that only kloud's user (or root) can change a plugin binary or the plugin
// directory: whoever can replace a binary runs code as its plugin (with kloud's privileges if
// it is allowed to run unsandboxed).
func trusted(fi os.FileInfo) error {
	if fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("writable by group or others (mode %s)", fi.Mode().Perm())
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid != 0 && int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("owned by uid %d, neither root nor kloud's user", st.Uid)
	}
	return nil
}

// scan reads the plugin directory once: starts new plugins, restarts replaced ones, stops
// removed ones.
func (l *launcher) scan() {
	found := map[string]string{} // name → identity
	bins := map[string]string{}  // name → path
	ents, err := os.ReadDir(l.dir)
	if err != nil {
		l.log.Error("read the plugin directory", "dir", l.dir, "err", err)
		return
	}
	if fi, err := os.Stat(l.dir); err != nil || trusted(fi) != nil {
		if err == nil {
			err = trusted(fi)
		}
		l.refuse("*", "dir", fmt.Errorf("plugin directory %s: %w: no plugin is launched from it", l.dir, err))
		return
	}
	for _, e := range ents {
		name, ok := strings.CutPrefix(e.Name(), Prefix)
		if !ok {
			continue
		}
		path := filepath.Join(l.dir, e.Name())
		fi, err := os.Stat(path) // follows a symlink
		if err != nil || !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 {
			continue
		}
		id := fileID(fi)
		if err := kitekey.ValidProviderName(name); err != nil {
			l.refuse(name, id, fmt.Errorf("%s: not a plugin's name: %w", e.Name(), err))
			continue
		}
		if err := trusted(fi); err != nil {
			l.refuse(name, id, fmt.Errorf("%s: %w: not launched", path, err))
			continue
		}
		found[name], bins[name] = id, path
	}

	l.mu.Lock()
	var stop []*launched
	for name, p := range l.running {
		if id, ok := found[name]; !ok || id != p.id {
			stop = append(stop, p)
			delete(l.running, name)
		}
	}
	l.mu.Unlock()
	for _, p := range stop {
		if _, ok := found[p.name]; ok {
			l.log.Info("provider plugin binary replaced: restarting it", "provider", p.name, "bin", p.bin)
		} else {
			l.log.Info("provider plugin binary removed: stopping it", "provider", p.name, "bin", p.bin)
		}
		l.stopOne(p)
		if _, ok := found[p.name]; !ok {
			l.plugins.SetError(p.name, fmt.Errorf("%s was removed from the plugin directory %s: kloud stopped it", filepath.Base(p.bin), l.dir))
		}
	}

	names := make([]string, 0, len(found))
	for n := range found {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		l.mu.Lock()
		_, running := l.running[name]
		l.mu.Unlock()
		if running {
			continue
		}
		if l.h.IsBuiltin(name) {
			// Not listed as a plugin: the name is the in-tree provider's.
			l.refuse(name, found[name], fmt.Errorf("%s%s: %q is the name of a provider built into kloud; rename the plugin", Prefix, name, name))
			continue
		}
		if err := l.canLaunch(name); err != nil {
			if l.refuse(name, found[name], err) {
				l.plugins.Expect(name, "not launched")
				l.plugins.SetError(name, err)
			}
			continue
		}
		l.start(name, bins[name], found[name])
	}
}

// canLaunch says why plugin name cannot be launched (nil if it can).
func (l *launcher) canLaunch(name string) error {
	if !sandbox.Installed() {
		return errors.New("this kloud binary cannot launch plugins: its main must call sandbox.MaybeRun (cmd/kloud does)")
	}
	if !l.unsandboxed(name) {
		if err := sandbox.Check(); err != nil {
			return fmt.Errorf("cannot sandbox the plugin: %w; run kloud as root, or for development only start it with --plugin-insecure-no-sandbox (plugins then run with your privileges)", err)
		}
	}
	return nil
}

// refuse logs, once per binary, why a plugin is not launched; it reports whether this is the
// first time for this binary.
func (l *launcher) refuse(name, id string, err error) bool {
	l.mu.Lock()
	seen := l.refused[name] == id
	l.refused[name] = id
	l.mu.Unlock()
	if !seen {
		l.log.Error("provider plugin not launched", "provider", name, "err", err)
	}
	return !seen
}

func (l *launcher) unsandboxed(name string) bool {
	return l.o.Insecure || slices.Contains(l.o.Unsandboxed, name)
}

// start begins supervising the plugin binary bin.
func (l *launcher) start(name, bin, id string) {
	p := &launched{name: name, bin: bin, id: id, stop: make(chan struct{}), done: make(chan struct{})}
	l.mu.Lock()
	l.running[name] = p
	delete(l.refused, name)
	l.mu.Unlock()
	l.plugins.Expect(name, "launched, starting")
	go l.supervise(p)
}

func (l *launcher) stopOne(p *launched) {
	close(p.stop)
	<-p.done
}

// stopAll stops every plugin (in parallel) and waits for them.
func (l *launcher) stopAll() {
	l.mu.Lock()
	all := make([]*launched, 0, len(l.running))
	for _, p := range l.running {
		all = append(all, p)
	}
	l.running = map[string]*launched{}
	l.mu.Unlock()
	for _, p := range all {
		close(p.stop)
	}
	for _, p := range all {
		<-p.done
	}
}

// supervise runs p until it is stopped, restarting it with backoff when it exits.
func (l *launcher) supervise(p *launched) {
	defer close(p.done)
	attempt := 0
	for {
		started := time.Now()
		exit, err := l.runOnce(p)
		select {
		case <-p.stop:
			return
		default:
		}
		// Only time connected counts as service: on a loaded host a sandboxed start can take
		// longer than ResetAfter by itself, and a plugin that dies right after that is still
		// crash-looping (ci of 05fc853: 13s to register, killed 3s later, attempt 1 again).
		if l.plugins.Served(p.name, started) >= l.o.ResetAfter {
			attempt = 0
		}
		delay := l.backoff(attempt)
		attempt++
		cause := err
		if cause == nil {
			cause = exit
		}
		l.log.Error("provider plugin exited; restarting it", "provider", p.name, "cause", cause, "in", delay.Round(time.Millisecond), "attempt", attempt)
		l.plugins.SetError(p.name, fmt.Errorf("%w; restarting it in %s", cause, delay.Round(time.Millisecond)))
		select {
		case <-p.stop:
			return
		case <-time.After(delay):
		}
	}
}

// backoff is MinBackoff·2ⁿ, at most MaxBackoff, with up to 10% jitter.
func (l *launcher) backoff(n int) time.Duration {
	d := l.o.MinBackoff
	for i := 0; i < n && d < l.o.MaxBackoff; i++ {
		d *= 2
	}
	d = min(d, l.o.MaxBackoff)
	return d + time.Duration(rand.Int64N(int64(d)/10+1))
}
