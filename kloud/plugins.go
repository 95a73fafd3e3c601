package kloud

// Provider plugins (provider/plugin): the launcher that starts and supervises the plugins of the
// plugin directory, and the routes plugins and users call (plugin.register, provider.list,
// provider.keyCreate). The plugin host (plugin.Host: proxies in the provider registry, their
// connections and status) is package plugin's; this file runs processes and answers methods.
//
// # The launcher
//
// Every regular, executable file `kloud-provider-NAME` of Options.PluginDir (default
// <data dir>/plugins) is a plugin kloud runs. The directory is rescanned every
// PluginOptions.Rescan (2 s): a new binary is started, a replaced one (other size, mtime or
// inode) restarted, a removed one stopped. So `kloud provider install` only copies the binary
// there (atomically: a temporary name, then a rename). The directory and the binaries must be
// writable only by kloud's user (or root), or nothing in them is launched.
//
// Each plugin runs through terraformer/tfsandbox, the launcher terraform runs through: this
// kloud binary re-executed (cmd/kloud's main calls sandbox.MaybeRun), which starts the
// plugin as PluginOptions.UID/GID (default 65534, nobody) with no capabilities, in its own pid,
// mount, ipc and uts namespaces, seeing only the system's read-only directories, the plugin
// binary's directory (read-only) and its own state directory <data dir>/plugin-state/NAME
// (read-write, owned by that uid), with terminals of its own (a private devpts: the example
// provider's machines serve web terminals): not kloud's data directory, keys or store. Its environment is
// only PATH and
//
//	KLOUD_PLUGIN_URL        kloud's kite endpoint on loopback (ws://127.0.0.1:PORT/kite)
//	KLOUD_PLUGIN_KEY        a plugin key for NAME, minted for this start, expiring in 24 h
//	KLOUD_PLUGIN_STATE_DIR  its state directory
//
// Its stdout and stderr lines go to kloud's log with provider=NAME. When it exits it is started
// again after a backoff (0.2 s doubling to 30 s, back to 0.2 s after a minute up); the exit, its
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
	"bufio"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kloud-dev/kloud/internal/cgroups"
	"github.com/kloud-dev/kloud/internal/sandbox"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/provider/plugin"
)

// PluginPrefix starts the file name of every plugin binary: kloud-provider-NAME.
const PluginPrefix = "kloud-provider-"

// Defaults of PluginOptions.
const (
	DefaultPluginRescan     = 2 * time.Second
	DefaultPluginMinBackoff = 200 * time.Millisecond
	DefaultPluginMaxBackoff = 30 * time.Second
	DefaultPluginResetAfter = time.Minute
	DefaultPluginStopGrace  = 5 * time.Second
	DefaultPluginKeyTTL     = 24 * time.Hour
)

// PluginOptions configure the plugin launcher (plugins.go). Zero fields take the defaults above.
type PluginOptions struct {
	// NoLaunch: do not scan Options.PluginDir or start anything (remote plugins may still
	// register).
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
	// MinBackoff (0.2s) up to MaxBackoff (30s); after ResetAfter (1 min) up, MinBackoff again.
	MinBackoff, MaxBackoff, ResetAfter time.Duration
	// StopGrace is how long a plugin has to exit after SIGTERM before SIGKILL (default 5s).
	StopGrace time.Duration
	// KeyTTL is the lifetime of the plugin key a launched plugin gets (default 24h; each start
	// gets a fresh one).
	KeyTTL time.Duration
}

func (o *PluginOptions) defaults() {
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
	def(&o.Rescan, DefaultPluginRescan)
	def(&o.MinBackoff, DefaultPluginMinBackoff)
	def(&o.MaxBackoff, DefaultPluginMaxBackoff)
	def(&o.ResetAfter, DefaultPluginResetAfter)
	def(&o.StopGrace, DefaultPluginStopGrace)
	def(&o.KeyTTL, DefaultPluginKeyTTL)
}

// PluginHost returns the host of this kloud's provider plugins (their proxies and status).
func (s *Server) PluginHost() *plugin.Host { return s.plugins }

// PluginDir is the directory of the plugins this kloud launches.
func (s *Server) PluginDir() string { return s.opts.PluginDir }

// PluginPID returns the pid of the launcher process of the running plugin name (the sandbox's
// launcher, or the plugin itself when it runs unsandboxed), 0 if none runs.
func (s *Server) PluginPID(name string) int {
	if s.launcher == nil {
		return 0
	}
	return s.launcher.pid(name)
}

// launcher starts and supervises the plugins of the plugin directory.
type launcher struct {
	s        *Server
	o        PluginOptions
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

// loopbackKiteURL is kloud's kite endpoint on loopback for a server listening on addr.
func loopbackKiteURL(addr net.Addr, tls bool) string {
	scheme := "ws://"
	if tls {
		scheme = "wss://"
	}
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return scheme + addr.String() + "/kite"
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return scheme + net.JoinHostPort(host, port) + "/kite"
}

// publicHost is the host name (without port) of a URL.
func publicHost(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return ""
	}
	return p.Hostname()
}

// runPlugins launches and supervises the plugin directory's plugins until ctx ends, then stops
// them all and returns once none is left. It closes s.pluginsDone when it returns.
func (s *Server) runPlugins(ctx context.Context) {
	defer close(s.pluginsDone)
	if s.opts.Plugins.NoLaunch {
		return
	}
	l := s.launcher
	if err := os.MkdirAll(l.dir, 0o755); err != nil {
		s.log.ErrorContext(ctx, "plugin directory: no provider plugin will be launched", "dir", l.dir, "err", err)
		return
	}
	s.log.InfoContext(ctx, "provider plugins", "dir", l.dir, "sandbox", !l.o.Insecure, "unsandboxed", l.o.Unsandboxed, "limits", l.o.Limits)
	if l.o.Limits != nil && !l.o.Insecure {
		if removed, err := sandbox.RemoveLeftovers(sandbox.CgroupPrefixPlugin); len(removed) > 0 || err != nil {
			s.log.InfoContext(ctx, "removed the cgroups of plugins a killed kloud left", "cgroups", removed, "err", err)
		}
	}
	if l.o.Insecure {
		s.log.WarnContext(ctx, "provider plugins run WITHOUT their sandbox (--plugin-insecure-no-sandbox): third-party code runs with kloud's privileges and sees its data directory; development only")
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
		l.s.log.Error("read the plugin directory", "dir", l.dir, "err", err)
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
		name, ok := strings.CutPrefix(e.Name(), PluginPrefix)
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
			l.s.log.Info("provider plugin binary replaced: restarting it", "provider", p.name, "bin", p.bin)
		} else {
			l.s.log.Info("provider plugin binary removed: stopping it", "provider", p.name, "bin", p.bin)
		}
		l.stopOne(p)
		if _, ok := found[p.name]; !ok {
			l.s.plugins.SetError(p.name, fmt.Errorf("%s was removed from the plugin directory %s: kloud stopped it", filepath.Base(p.bin), l.dir))
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
		if l.s.isBuiltin(name) {
			// Not listed as a plugin: the name is the in-tree provider's.
			l.refuse(name, found[name], fmt.Errorf("%s%s: %q is the name of a provider built into kloud; rename the plugin", PluginPrefix, name, name))
			continue
		}
		if err := l.canLaunch(name); err != nil {
			if l.refuse(name, found[name], err) {
				l.s.plugins.Expect(name, "not launched")
				l.s.plugins.SetError(name, err)
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
		l.s.log.Error("provider plugin not launched", "provider", name, "err", err)
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
	l.s.plugins.Expect(name, "launched, starting")
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
		if time.Since(started) >= l.o.ResetAfter {
			attempt = 0
		}
		delay := l.backoff(attempt)
		attempt++
		cause := err
		if cause == nil {
			cause = exit
		}
		l.s.log.Error("provider plugin exited; restarting it", "provider", p.name, "cause", cause, "in", delay.Round(time.Millisecond), "attempt", attempt)
		l.s.plugins.SetError(p.name, fmt.Errorf("%w; restarting it in %s", cause, delay.Round(time.Millisecond)))
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

// pluginEnvPath is the PATH a plugin gets (nothing else of kloud's environment reaches it).
const pluginEnvPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// runOnce starts the plugin, waits until it exits (the error says how, with its last lines) or
// is stopped (SIGTERM, SIGKILL after StopGrace). err is for a plugin that could not be started.
func (l *launcher) runOnce(p *launched) (exit, err error) {
	unsandboxed := l.unsandboxed(p.name)
	state := filepath.Join(l.stateDir, p.name)
	if err := os.MkdirAll(state, 0o700); err != nil {
		return nil, fmt.Errorf("plugin state directory: %w", err)
	}
	if !unsandboxed {
		if err := os.Chown(state, l.o.UID, l.o.GID); err != nil {
			return nil, fmt.Errorf("plugin state directory: %w", err)
		}
	}
	key, _, err := l.s.Kontrol.CreatePluginKey(kitekey.PluginKeySpec{Provider: p.name, TTL: l.o.KeyTTL})
	if err != nil {
		return nil, fmt.Errorf("mint the plugin's key: %w", err)
	}
	run := "plugin-" + p.name + "-" + randomHex(8)
	// PTY: a provider's machines may be processes of the plugin whose agents serve terminals
	// (the example provider's); the sandbox's own devpts, none of the host's terminals.
	cfg := sandbox.Config{Program: p.bin, WorkDir: state, ReadOnly: []string{filepath.Dir(p.bin)},
		UID: l.o.UID, GID: l.o.GID, Insecure: unsandboxed, PTY: true, CgroupPrefix: sandbox.CgroupPrefixPlugin}
	if !unsandboxed {
		cfg.Limits = l.o.Limits
	}
	senv, err := cfg.Env(run)
	if err != nil {
		return nil, err
	}
	env := []string{pluginEnvPath, plugin.EnvURL + "=" + l.url, plugin.EnvKey + "=" + key, plugin.EnvStateDir + "=" + state}
	if l.s.opts.TLS != nil { // l.url is wss on loopback; the certificate names the public host
		env = append(env, plugin.EnvCA+"="+l.s.opts.CACert, plugin.EnvServerName+"="+publicHost(l.s.opts.PublicURL))
	}
	for k, v := range senv {
		env = append(env, k+"="+v)
	}
	tail := &lineTail{max: 5}
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	started := make(chan error, 1)
	sig := make(chan syscall.Signal)
	exited := make(chan struct{})
	var waitErr error
	var pid int
	go func() {
		// Pdeathsig follows the thread that started the child: keep this goroutine on its
		// thread until the child is gone.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		cmd := exec.Command("/proc/self/exe")
		cmd.Args[0] = PluginPrefix + p.name + " (launcher)"
		cmd.Env, cmd.Dir = env, state
		cmd.Stdout, cmd.Stderr = outW, outW
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		err := cmd.Start()
		outW.Close()
		if err != nil {
			started <- err
			return
		}
		pid = cmd.Process.Pid
		started <- nil
		waited := make(chan error, 1)
		go func() { waited <- cmd.Wait() }()
		for {
			select {
			case s := <-sig:
				if s == syscall.SIGKILL {
					syscall.Kill(-pid, syscall.SIGKILL) // the group: an unsandboxed plugin's children too
				}
				cmd.Process.Signal(s)
			case err := <-waited:
				waitErr = err
				close(exited)
				return
			}
		}
	}()
	if err := <-started; err != nil {
		outR.Close()
		return nil, fmt.Errorf("start %s: %w", p.bin, err)
	}
	p.setPID(pid)
	defer p.setPID(0)
	where := fmt.Sprintf("launched (pid %d, sandboxed as uid %d)", pid, l.o.UID)
	if unsandboxed {
		where = fmt.Sprintf("launched (pid %d, unsandboxed)", pid)
		if !l.o.Insecure {
			l.s.log.Warn("provider plugin runs WITHOUT its sandbox, with kloud's privileges, as an administrator allowed (--plugin-unsandboxed)", "provider", p.name, "pid", pid)
		}
	}
	l.s.plugins.Expect(p.name, where)
	l.s.log.Info("provider plugin started", "provider", p.name, "pid", pid, "bin", p.bin, "sandboxed", !unsandboxed)
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		l.copyOutput(p.name, outR, tail)
	}()
	send := func(s syscall.Signal) {
		select {
		case sig <- s:
		case <-exited:
		}
	}
	stopped := false
	select {
	case <-exited:
	case <-p.stop:
		stopped = true
		send(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(l.o.StopGrace):
			l.s.log.Warn("provider plugin did not stop in time; killing it", "provider", p.name, "pid", pid, "grace", l.o.StopGrace)
			send(syscall.SIGKILL)
			<-exited
		}
	}
	sandbox.Kill(run) // whatever an unsandboxed plugin left carrying its run token
	if err := sandbox.RemoveCgroup(cfg, run); err != nil {
		l.s.log.Warn("provider plugin's cgroup", "provider", p.name, "err", err)
	}
	// A descendant holding the pipe would keep the copy going: do not wait for it long.
	select {
	case <-copied:
	case <-time.After(time.Second):
		outR.Close()
	}
	cause := describeExit(waitErr, !unsandboxed)
	if stopped {
		l.s.log.Info("provider plugin stopped", "provider", p.name, "pid", pid, "exit", cause)
	}
	msg := fmt.Sprintf("%s%s (pid %d) exited (%s)", PluginPrefix, p.name, pid, cause)
	if last := tail.String(); last != "" {
		msg += "; its last output: " + last
	}
	return errors.New(msg), nil
}

// copyOutput logs the plugin's output lines with provider=name and keeps the last few.
func (l *launcher) copyOutput(name string, r io.ReadCloser, tail *lineTail) {
	defer r.Close()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.TrimSpace(line) == "" {
			continue
		}
		tail.add(line)
		l.s.log.Info("plugin: "+line, "provider", name)
	}
	if err := sc.Err(); err != nil {
		l.s.log.Warn("plugin output: the rest is not logged", "provider", name, "err", err)
		io.Copy(io.Discard, r) // keep draining: a full pipe would block the plugin
	}
}

// describeExit says how a plugin process ended. Sandboxed, the launcher exits with 128+n when
// the plugin was killed by signal n.
func describeExit(err error, sandboxed bool) string {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return "exit status 0"
	case errors.As(err, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok {
			if ws.Signaled() {
				return "killed by " + unix.SignalName(ws.Signal())
			}
			if c := ws.ExitStatus(); sandboxed && c > 128 && c < 128+65 {
				return "killed by " + unix.SignalName(syscall.Signal(c-128))
			}
		}
		return ee.ProcessState.String()
	}
	return err.Error()
}

// lineTail keeps the last max lines written to it.
type lineTail struct {
	mu    sync.Mutex
	max   int
	lines []string
}

func (t *lineTail) add(line string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(line) > 500 {
		line = line[:500] + "…"
	}
	t.lines = append(t.lines, line)
	if len(t.lines) > t.max {
		t.lines = t.lines[len(t.lines)-t.max:]
	}
}

func (t *lineTail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.Join(t.lines, " | ")
}

func randomHex(n int) string {
	b := make([]byte, n)
	crand.Read(b)
	return hex.EncodeToString(b)
}

// isBuiltin reports whether name is an in-tree provider: in the registry, and not a plugin the
// host knows (a proxy is Replace'd into the registry under its plugin's name).
func (s *Server) isBuiltin(name string) bool {
	if _, err := s.providers.Lookup(name); err != nil {
		return false
	}
	for _, st := range s.plugins.Status() {
		if st.Name == name {
			return false
		}
	}
	return true
}

// pluginRegister serves plugin.register: plugin keys only (the route's Gate refuses agents; users
// are refused here), for the provider their key names; the host checks the version and manifest
// and installs the proxy.
func (s *Server) pluginRegister(ctx context.Context, r *kite.Request, p *api.PluginRegisterParams) (api.PluginRegisterResult, error) {
	if !kitekey.IsPlugin(r.Principal()) {
		return api.PluginRegisterResult{}, fmt.Errorf("%s is for provider plugins (plugin keys: `kloud key create --provider NAME`): %w", r.Method, kite.ErrPermission)
	}
	if s.isBuiltin(p.Provider.Name) {
		return api.PluginRegisterResult{}, fmt.Errorf("provider %q is built into kloud: a plugin cannot replace it: %w", p.Provider.Name, kite.ErrConflict)
	}
	rp := plugin.RegisterParams(*p)
	res, err := s.plugins.Register(ctx, r, &rp)
	if err != nil && errors.Is(err, kite.ErrInvalidParams) && p.Provider.Name == kitekey.PluginName(r.Principal()) {
		// Refused for what it is (an API version kloud does not speak, an invalid manifest):
		// provider.list shows why, also for a remote plugin that no supervisor watches.
		s.plugins.SetError(p.Provider.Name, err)
		s.log.ErrorContext(ctx, "provider plugin refused", "provider", p.Provider.Name, "err", err)
	}
	return deref(res, err)
}

// providerList serves provider.list: every provider, in-tree and plugin.
func (s *Server) providerList(ctx context.Context, c *Caller, _ *kite.Request, _ *api.NoParams) (api.ProviderListResult, error) {
	out := api.ProviderListResult{Providers: []api.ProviderStatus{}}
	plugins := map[string]plugin.Status{}
	for _, st := range s.plugins.Status() {
		plugins[st.Name] = st
	}
	names := s.providers.Names()
	for n := range plugins {
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	for _, n := range names {
		if st, ok := plugins[n]; ok {
			ps := api.ProviderStatus{
				Name: n, Kind: api.ProviderPlugin, Version: st.Version, APIVersion: st.APIVersion, Where: st.Where,
				Connected: st.Connected, LastError: st.LastError, Capabilities: capStrings(st.Capabilities),
			}
			if !st.ConnectedAt.IsZero() {
				ps.ConnectedAt = new(st.ConnectedAt)
			}
			if !st.DisconnectedAt.IsZero() {
				ps.DisconnectedAt = new(st.DisconnectedAt)
			}
			if !c.Admin {
				// Where (pids, addresses) and the plugin's last output lines are for
				// administrators: a plugin's output is its own and may say anything.
				ps.Where = "plugin"
				if ps.LastError != "" {
					ps.LastError = "the plugin failed (kloud administrators see why in `kloud provider list`)"
				}
			}
			out.Providers = append(out.Providers, ps)
			continue
		}
		p, err := s.providers.Lookup(n)
		if err != nil {
			continue
		}
		ps := api.ProviderStatus{Name: n, Kind: api.ProviderBuiltin, Where: "in process", Connected: true, Capabilities: capStrings(p.Caps())}
		if p.Available != nil {
			if err := p.Available(); err != nil {
				ps.Connected, ps.LastError = false, "unavailable on this host: "+err.Error()
			}
		}
		out.Providers = append(out.Providers, ps)
	}
	return out, nil
}

func capStrings[T ~string](cs []T) []string {
	out := make([]string, 0, len(cs))
	for _, c := range cs {
		out = append(out, string(c))
	}
	return out
}

// providerKeyCreate serves provider.keyCreate: a kloud administrator mints the key a remote
// plugin dials kloud with (no expiry; revocable by its kite id with kontrol.revoke). Logged.
func (s *Server) providerKeyCreate(ctx context.Context, c *Caller, _ *kite.Request, p *api.ProviderKeyCreateParams) (api.ProviderKeyCreateResult, error) {
	if s.isBuiltin(p.Provider) {
		return api.ProviderKeyCreateResult{}, fmt.Errorf("provider %q is built into kloud: a plugin cannot use its name: %w", p.Provider, kite.ErrConflict)
	}
	id := p.KiteID
	if id == "" {
		id = kitekey.PluginIDPrefix + p.Provider + "." + randomHex(8)
	}
	key, id, err := s.Kontrol.CreatePluginKey(kitekey.PluginKeySpec{Provider: p.Provider, KiteID: id})
	if err != nil {
		return api.ProviderKeyCreateResult{}, err
	}
	s.log.WarnContext(ctx, "plugin key created", "provider", p.Provider, "kiteId", id, "by", c.Username)
	return api.ProviderKeyCreateResult{Provider: p.Provider, KiteID: id, Key: key}, nil
}

// serveProvider dispatches /provider/NAME/... to provider NAME's Handler, looked up per request:
// an in-tree provider's, or a plugin's proxy (which serves it over the plugin's connection), so a
// plugin that registers after kloud started is served too.
func (s *Server) serveProvider(w http.ResponseWriter, r *http.Request) {
	rest := strings.TrimPrefix(r.URL.Path, "/provider/")
	name, _, slash := strings.Cut(rest, "/")
	p, err := s.providers.Lookup(name)
	if name == "" || err != nil || p.Handler == nil {
		http.NotFound(w, r)
		return
	}
	if !slash {
		http.Redirect(w, r, provider.HandlerPrefix(name), http.StatusMovedPermanently)
		return
	}
	// A provider's service is for its machines and its Terraform provider, never for browsers,
	// and it may be a plugin (third-party code): it gets no user's session cookie, and what it
	// answers cannot run as kloud's web UI (a sandboxed, script-less document of its own origin).
	r.Header.Del("Cookie")
	w.Header().Set("Content-Security-Policy", "sandbox; default-src 'none'")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	p.Handler.ServeHTTP(w, r)
}
