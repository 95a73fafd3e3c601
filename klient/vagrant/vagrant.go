// Package vagrant is what a host klient (klient --vagrant) does with Vagrant: it keeps one
// directory per machine under its vagrant home and runs the vagrant command there, with
// VAGRANT_HOME under klient's own directory and Vagrant's version check off.
//
// Start with New and Manager: Create writes a machine's directory, Up/Halt/Destroy run `vagrant
// up|halt|destroy -f` in it, Status parses `vagrant status --machine-readable`, List walks the
// directories. Calls on one machine are serialised; a ctx that ends kills the vagrant process
// (its whole process group). Info (info.go) reports the host's CPUs and memory; snapshot.go
// saves and restores machines' disks.
//
// # A machine's directory
//
//	<home>/machines/<name>/
//	  Vagrantfile    the same for every machine (vagrantfileSrc): it reads kloud.json, so no
//	                 parameter is ever Ruby source (no injection through a box name or a hostname)
//	  kloud.json     the validated parameters (klientapi.VagrantCreateParams without the token)
//	  seed/          cloud-init's NoCloud seed: user-data (0600) and meta-data
//	  boot.sh        docker provider: the container's command (the four cloud-init stages, then
//	                 wait for SIGTERM); cloud.cfg: NoCloud only, network config off
//
// With the docker provider the container gets the host's network (--network=host: the machine
// reaches kloud as the host does), docker's init as PID 1 (reaps orphans, forwards SIGTERM),
// the seed, boot script and cloud.cfg as read-only volumes, and --memory/--cpus from the
// parameters. halt keeps the container (its writable layer is the machine's disk); destroy
// removes it. With a box provider (virtualbox, libvirt, ...) the seed is given to Vagrant's
// cloud_init support (VAGRANT_EXPERIMENTAL=cloud_init) and memory/cpus to the provider block.
package vagrant

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kloud-dev/kloud/klient/klientapi"
)

// Options configure a Manager.
type Options struct {
	// Home is the vagrant home of this klient (required): machines live in Home/machines,
	// Vagrant's own data (VAGRANT_HOME) in Home/vagrant.d.
	Home string
	// Vagrant is the vagrant binary (default: "vagrant" on PATH).
	Vagrant string
	// Env is added to the environment of every vagrant command (e.g. DOCKER_HOST); the
	// process's own environment is passed on too.
	Env []string
	// Logger; nil discards.
	Logger *slog.Logger
}

// Errors of the Manager, for kite codes (klient maps them).
var (
	ErrNotFound = errors.New("no such vagrant machine")
	ErrExists   = errors.New("the vagrant machine exists with other parameters")
)

// Manager runs Vagrant for one host klient.
type Manager struct {
	o   Options
	log *slog.Logger
	bin string

	mu    sync.Mutex
	locks map[string]*sync.Mutex
}

// New checks the options and finds vagrant; a host without vagrant is an error that says so.
func New(o Options) (*Manager, error) {
	if o.Home == "" {
		return nil, errors.New("vagrant: no home directory")
	}
	home, err := filepath.Abs(o.Home)
	if err != nil {
		return nil, fmt.Errorf("vagrant home: %w", err)
	}
	o.Home = home
	if o.Vagrant == "" {
		o.Vagrant = "vagrant"
	}
	bin, err := exec.LookPath(o.Vagrant)
	if err != nil {
		return nil, fmt.Errorf("vagrant is not installed (%w): install it (Debian: apt-get install vagrant) or run klient without --vagrant", err)
	}
	for _, d := range []string{o.Home, filepath.Join(o.Home, "machines"), filepath.Join(o.Home, "vagrant.d")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("vagrant home: %w", err)
		}
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Manager{o: o, log: log, bin: bin, locks: map[string]*sync.Mutex{}}, nil
}

// Home is the manager's vagrant home (absolute).
func (m *Manager) Home() string { return m.o.Home }

// Dir is the directory of machine name.
func (m *Manager) Dir(name string) string { return filepath.Join(m.o.Home, "machines", name) }

// lock serialises the operations on one machine.
func (m *Manager) lock(name string) func() {
	m.mu.Lock()
	l := m.locks[name]
	if l == nil {
		l = &sync.Mutex{}
		m.locks[name] = l
	}
	m.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// params is kloud.json: the machine's parameters, as the Vagrantfile reads them.
type params struct {
	Name     string `json:"name"`
	Provider string `json:"provider,omitempty"`
	Box      string `json:"box,omitempty"`
	Image    string `json:"image,omitempty"`
	Hostname string `json:"hostname"`
	MemoryMB int    `json:"memoryMB,omitempty"`
	CPUs     int    `json:"cpus,omitempty"`
}

const paramsFile = "kloud.json"

// Create writes machine p.Name's directory (p must be valid: klientapi's Validate). It returns
// the machine (state notCreated when new).
func (m *Manager) Create(ctx context.Context, p klientapi.VagrantCreateParams) (klientapi.VagrantMachine, error) {
	p.Token = ""
	if err := p.ValidateMachine(); err != nil {
		return klientapi.VagrantMachine{}, err
	}
	defer m.lock(p.Name)()
	pp := params{Name: p.Name, Provider: p.Provider, Box: p.Box, Image: p.Image, Hostname: p.Hostname, MemoryMB: p.MemoryMB, CPUs: p.CPUs}
	if pp.Provider == "" && pp.Image != "" {
		pp.Provider = "docker"
	}
	if pp.Hostname == "" {
		pp.Hostname = p.Name
	}
	dir := m.Dir(p.Name)
	if old, err := readParams(dir); err == nil {
		ud, _ := os.ReadFile(filepath.Join(dir, "seed", "user-data"))
		if old != pp || string(ud) != p.UserData {
			return klientapi.VagrantMachine{}, fmt.Errorf("machine %s: %w: destroy it first", p.Name, ErrExists)
		}
		return m.status(ctx, p.Name)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return klientapi.VagrantMachine{}, err
	}
	// Written beside, then renamed into place: a half-written machine is never seen.
	tmp, err := os.MkdirTemp(filepath.Join(m.o.Home, "machines"), "."+p.Name+".tmp-")
	if err != nil {
		return klientapi.VagrantMachine{}, fmt.Errorf("machine dir: %w", err)
	}
	defer os.RemoveAll(tmp)
	if err := writeMachine(tmp, pp, p.UserData); err != nil {
		return klientapi.VagrantMachine{}, fmt.Errorf("machine %s: %w", p.Name, err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		return klientapi.VagrantMachine{}, fmt.Errorf("machine dir: %w", err)
	}
	m.log.Info("vagrant machine created", "name", p.Name, "provider", pp.Provider, "box", pp.Box, "image", pp.Image)
	return m.view(pp, klientapi.VagrantNotCreated), nil
}

func writeMachine(dir string, pp params, userData string) error {
	js, err := json.MarshalIndent(pp, "", "  ")
	if err != nil {
		return err
	}
	meta, _ := json.Marshal(map[string]string{"instance-id": pp.Name, "local-hostname": pp.Hostname})
	if userData == "" {
		userData = "#cloud-config\n{}\n"
	}
	files := []struct {
		name string
		data []byte
		mode os.FileMode
	}{
		{"Vagrantfile", []byte(vagrantfileSrc), 0o644},
		{paramsFile, append(js, '\n'), 0o644},
		{"boot.sh", []byte(bootSh), 0o755},
		{"cloud.cfg", []byte(cloudCfg()), 0o644},
		{"seed/meta-data", append(meta, '\n'), 0o644},
		// Read by cloud-init as root in the container (a bind mount keeps the host's mode).
		{"seed/user-data", []byte(userData), 0o600},
	}
	if err := os.Mkdir(filepath.Join(dir, "seed"), 0o755); err != nil {
		return err
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(dir, f.name), f.data, f.mode); err != nil {
			return err
		}
	}
	return os.Chmod(dir, 0o700)
}

func readParams(dir string) (params, error) {
	var pp params
	b, err := os.ReadFile(filepath.Join(dir, paramsFile))
	if err != nil {
		return pp, err
	}
	if err := json.Unmarshal(b, &pp); err != nil {
		return pp, fmt.Errorf("%s: %w", filepath.Join(dir, paramsFile), err)
	}
	return pp, nil
}

func (m *Manager) view(pp params, state string) klientapi.VagrantMachine {
	vm := klientapi.VagrantMachine{
		Name: pp.Name, State: state, Provider: pp.Provider, Box: pp.Box, Image: pp.Image,
		Hostname: pp.Hostname, MemoryMB: pp.MemoryMB, CPUs: pp.CPUs, Dir: m.Dir(pp.Name),
	}
	if pp.Provider != "" && state != klientapi.VagrantNotCreated {
		// Vagrant keeps the provider's id of the machine in its dotfile directory.
		if b, err := os.ReadFile(filepath.Join(vm.Dir, ".vagrant", "machines", "default", pp.Provider, "id")); err == nil {
			vm.ID = strings.TrimSpace(string(b))
		}
	}
	return vm
}

// Up boots the machine (`vagrant up`, with its provider); a running machine stays as it is.
func (m *Manager) Up(ctx context.Context, name string) (klientapi.VagrantMachine, error) {
	defer m.lock(name)()
	pp, err := m.machine(name)
	if err != nil {
		return klientapi.VagrantMachine{}, err
	}
	args := []string{"up", "--no-provision"}
	if pp.Provider != "" {
		args = append(args, "--provider="+pp.Provider)
	}
	_, err = m.run(ctx, name, args...)
	for try := 1; err != nil && try < upTries && vanishedContainer(err); try++ {
		m.log.Warn("vagrant up: a container vanished while Vagrant listed them; trying again", "machine", name, "err", err)
		_, err = m.run(ctx, name, args...)
	}
	if err != nil {
		return klientapi.VagrantMachine{}, err
	}
	// `vagrant up` succeeded: the machine runs. (Asking `vagrant status` would cost another
	// start of Vagrant, seconds on a busy host.)
	return m.view(pp, klientapi.VagrantRunning), nil
}

// upTries is how many times Up runs `vagrant up` when it fails only because a container vanished
// (vanishedContainer).
const upTries = 3

// vanishedContainer reports whether a `vagrant up` failed because Vagrant's docker provider
// lists every container of the daemon (docker ps -a) and then inspects each one to find the
// ports in use: a container removed in between, by anyone (another machine's destroy, the
// user's own containers), fails the up with "No such object", whatever the machine. Running
// `vagrant up` again is safe: a machine that got as far as running stays as it is.
func vanishedContainer(err error) bool {
	s := err.Error()
	return strings.Contains(s, `"docker", "inspect"`) && strings.Contains(s, "No such object")
}

// Halt stops the machine and keeps its disk.
func (m *Manager) Halt(ctx context.Context, name string) (klientapi.VagrantMachine, error) {
	defer m.lock(name)()
	pp, err := m.machine(name)
	if err != nil {
		return klientapi.VagrantMachine{}, err
	}
	if _, err := m.run(ctx, name, "halt"); err != nil {
		return klientapi.VagrantMachine{}, err
	}
	return m.view(pp, klientapi.VagrantStopped), nil
}

// Destroy removes the machine (`vagrant destroy -f`) and its directory. An absent machine is not
// an error.
func (m *Manager) Destroy(ctx context.Context, name string) error {
	defer m.lock(name)()
	dir := m.Dir(name)
	if _, err := m.machine(name); errors.Is(err, ErrNotFound) {
		return nil
	} else if err != nil {
		return err
	}
	if _, err := m.run(ctx, name, "destroy", "-f"); err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove machine dir: %w", err)
	}
	m.log.Info("vagrant machine destroyed", "name", name)
	return nil
}

// Status reports the machine's state (klientapi.VagrantAbsent when there is no such machine).
func (m *Manager) Status(ctx context.Context, name string) (klientapi.VagrantMachine, error) {
	defer m.lock(name)()
	return m.status(ctx, name)
}

func (m *Manager) status(ctx context.Context, name string) (klientapi.VagrantMachine, error) {
	pp, err := m.machine(name)
	if errors.Is(err, ErrNotFound) {
		return klientapi.VagrantMachine{Name: name, State: klientapi.VagrantAbsent}, nil
	}
	if err != nil {
		return klientapi.VagrantMachine{}, err
	}
	out, err := m.run(ctx, name, "status", "--machine-readable")
	if err != nil {
		return klientapi.VagrantMachine{}, err
	}
	return m.view(pp, parseState(out)), nil
}

// List returns every machine of this host klient with its state, sorted by name.
func (m *Manager) List(ctx context.Context) ([]klientapi.VagrantMachine, error) {
	ents, err := os.ReadDir(filepath.Join(m.o.Home, "machines"))
	if err != nil {
		return nil, err
	}
	out := []klientapi.VagrantMachine{}
	for _, e := range ents {
		if !e.IsDir() || klientapi.ValidVagrantName(e.Name()) != nil {
			continue
		}
		vm, err := m.Status(ctx, e.Name())
		if err != nil {
			return nil, err
		}
		if vm.State != klientapi.VagrantAbsent {
			out = append(out, vm)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// machine reads the machine's parameters, or ErrNotFound.
func (m *Manager) machine(name string) (params, error) {
	if err := klientapi.ValidVagrantName(name); err != nil {
		return params{}, err
	}
	pp, err := readParams(m.Dir(name))
	if errors.Is(err, fs.ErrNotExist) {
		return params{}, fmt.Errorf("machine %s: %w", name, ErrNotFound)
	}
	return pp, err
}

// parseState reads the state line of `vagrant status --machine-readable`
// ("<time>,default,state,<state>").
func parseState(out []byte) string {
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.SplitN(sc.Text(), ",", 4)
		if len(f) == 4 && f[2] == "state" {
			switch f[3] {
			case "running":
				return klientapi.VagrantRunning
			case "not_created":
				return klientapi.VagrantNotCreated
			case "stopped", "poweroff", "saved", "aborted", "paused", "shutoff", "shutdown":
				return klientapi.VagrantStopped
			}
			return klientapi.VagrantUnknown
		}
	}
	return klientapi.VagrantUnknown
}

// maxOutput bounds the output of one vagrant command kept for errors and parsing.
const maxOutput = 1 << 20

// run runs vagrant in machine name's directory. The process group is killed when ctx ends.
func (m *Manager) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, m.bin, args...)
	cmd.Dir = m.Dir(name)
	cmd.Env = m.env()
	var out limitedBuffer
	out.max = maxOutput
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	t0 := time.Now()
	err := cmd.Run()
	m.log.Debug("vagrant", "machine", name, "args", args, "took", time.Since(t0), "err", err)
	if ctx.Err() != nil {
		return nil, fmt.Errorf("vagrant %s (machine %s): %w", args[0], name, ctx.Err())
	}
	if err != nil {
		return nil, fmt.Errorf("vagrant %s (machine %s): %w: %s", args[0], name, err, tail(out.Bytes(), 2048))
	}
	return out.Bytes(), nil
}

func tail(b []byte, n int) string {
	b = bytes.TrimSpace(b)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// limitedBuffer keeps the first max bytes written (and discards the rest).
type limitedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
	max int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if room := l.max - l.buf.Len(); room > 0 {
		l.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (l *limitedBuffer) Bytes() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return bytes.Clone(l.buf.Bytes())
}

var _ io.Writer = (*limitedBuffer)(nil)

// env is the environment of a vagrant command: the process's, without the variables that would
// point vagrant at another Vagrantfile or data directory, plus Options.Env and ours.
func (m *Manager) env() []string {
	var out []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "VAGRANT_HOME", "VAGRANT_CWD", "VAGRANT_VAGRANTFILE", "VAGRANT_DOTFILE_PATH", "VAGRANT_EXPERIMENTAL", "VAGRANT_DEFAULT_PROVIDER":
			continue
		}
		out = append(out, kv)
	}
	out = append(out, m.o.Env...)
	return append(out,
		"VAGRANT_HOME="+filepath.Join(m.o.Home, "vagrant.d"),
		"VAGRANT_CHECKPOINT_DISABLE=1",
		"VAGRANT_NO_COLOR=1",
		// config.vm.cloud_init (box providers) is experimental in Vagrant 2.3.
		"VAGRANT_EXPERIMENTAL=cloud_init",
	)
}
