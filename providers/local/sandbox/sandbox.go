package sandbox

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kloud-dev/kloud/internal/cgroups"
	"github.com/kloud-dev/kloud/internal/selfexec"
	"github.com/kloud-dev/kloud/providers/bridgefw"
)

// Defaults for Options.
const (
	DefaultStateDir    = "/var/lib/kloud/machines"
	DefaultBridge      = "kd-br0"
	DefaultSubnet      = "10.200.0.0/24"
	DefaultStopTimeout = 10 * time.Second
	// DefaultPidsMax is a machine's default limit of processes and threads (Options.PidsMax).
	DefaultPidsMax = 4096

	bootTimeout = time.Minute // launcher start to init's setup report
)

// Errors, for errors.Is.
var (
	ErrNotFound   = errors.New("sandbox: machine not found")
	ErrExists     = errors.New("sandbox: machine already exists")
	ErrNotRunning = errors.New("sandbox: machine not running")
)

// Options configure a Manager. Zero fields take the documented defaults.
type Options struct {
	// StateDir holds one directory per machine (machine.json, upper/, work/, rootfs/,
	// console.log) plus lock files. Default DefaultStateDir. Every process that manages the same
	// machines must use the same StateDir, Bridge and Subnet.
	StateDir string
	// BaseImage is the root filesystem machines are created on (see EnsureBaseImage). Required by
	// Create; Start, Stop, Info and Destroy use the image recorded in machine.json.
	BaseImage string
	// Bridge is the host bridge machines are attached to. Default DefaultBridge.
	Bridge string
	// Subnet of the bridge. The bridge gets the first host address (.1, HostAddr), machines the
	// next free ones. IPv4, /16 to /30. Default DefaultSubnet.
	Subnet netip.Prefix
	// StopTimeout is how long Stop waits after SIGTERM before SIGKILL. Default DefaultStopTimeout.
	StopTimeout time.Duration
	// PidsMax is the processes-and-threads limit of machines whose Spec has none. 0:
	// DefaultPidsMax; -1: no limit.
	PidsMax int
	// Logger; nil discards.
	Logger *slog.Logger
}

// Manager creates and controls machines. All state is on disk under StateDir; any number of
// Managers in any number of processes may work on the same StateDir at once.
type Manager struct {
	fwMu                        sync.Mutex      // one firewall rebuild at a time (firewall.go)
	fw                          *bridgefw.Table // the bridge's firewall (firewall.go)
	stateDir, baseImage, bridge string
	subnet                      netip.Prefix
	hostAddr                    netip.Addr
	stopTimeout                 time.Duration
	pidsMax                     int
	log                         *slog.Logger
	mgrHash                     string
	ipPath, nsenterPath         string
}

var bridgeRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,14}$`)

// New checks the options and creates StateDir. It does not touch the network (see SetupNetwork).
func New(opts Options) (*Manager, error) {
	m := &Manager{
		stateDir: opts.StateDir, baseImage: opts.BaseImage, bridge: opts.Bridge, subnet: opts.Subnet,
		stopTimeout: opts.StopTimeout, log: opts.Logger, pidsMax: opts.PidsMax,
	}
	if m.pidsMax == 0 {
		m.pidsMax = DefaultPidsMax
	}
	if m.pidsMax < -1 || (m.pidsMax > 0 && m.pidsMax < 16) {
		return nil, fmt.Errorf("sandbox: pids max %d: at least 16, or -1 for no limit", m.pidsMax)
	}
	if m.stateDir == "" {
		m.stateDir = DefaultStateDir
	}
	abs, err := filepath.Abs(m.stateDir)
	if err != nil {
		return nil, fmt.Errorf("state dir: %w", err)
	}
	m.stateDir = abs
	if strings.ContainsAny(m.stateDir, ",:\n") {
		return nil, fmt.Errorf("state dir %q: must not contain ',' or ':' (overlay mount options)", m.stateDir)
	}
	if m.baseImage != "" {
		if m.baseImage, err = filepath.Abs(m.baseImage); err != nil {
			return nil, fmt.Errorf("base image: %w", err)
		}
		if strings.ContainsAny(m.baseImage, ",:\n") {
			return nil, fmt.Errorf("base image %q: must not contain ',' or ':'", m.baseImage)
		}
	}
	if m.bridge == "" {
		m.bridge = DefaultBridge
	}
	if !bridgeRE.MatchString(m.bridge) {
		return nil, fmt.Errorf("bridge name %q: 1-15 characters of [A-Za-z0-9_.-]", m.bridge)
	}
	if !m.subnet.IsValid() {
		m.subnet = netip.MustParsePrefix(DefaultSubnet)
	}
	if !m.subnet.Addr().Is4() || m.subnet.Bits() < 16 || m.subnet.Bits() > 30 {
		return nil, fmt.Errorf("subnet %s: want IPv4 between /16 and /30", m.subnet)
	}
	m.subnet = m.subnet.Masked()
	m.hostAddr = m.subnet.Addr().Next()
	if m.stopTimeout <= 0 {
		m.stopTimeout = DefaultStopTimeout
	}
	if m.log == nil {
		m.log = slog.New(slog.DiscardHandler)
	}
	m.fw = bridgefw.NewTable(m.bridge, m.subnet)
	m.fw.Log = m.log
	h := sha256.Sum256([]byte(m.stateDir))
	m.mgrHash = hex.EncodeToString(h[:])[:6]
	if m.ipPath, err = exec.LookPath("ip"); err != nil {
		return nil, errors.New("iproute2's ip is not installed")
	}
	m.nsenterPath, _ = exec.LookPath("nsenter") // only Exec needs it
	if err := os.MkdirAll(filepath.Join(m.stateDir, ".locks"), 0o700); err != nil {
		return nil, fmt.Errorf("state dir: %w", err)
	}
	return m, nil
}

// HostAddr is the bridge's address: the only host address machines can reach. Services the
// machines talk to (kloud, kontrol, the metadata server) listen there, after SetupNetwork.
func (m *Manager) HostAddr() netip.Addr { return m.hostAddr }

// Subnet is the bridge subnet.
func (m *Manager) Subnet() netip.Prefix { return m.subnet }

// Spec describes a machine to create.
type Spec struct {
	// ID names the machine: 1-64 of [A-Za-z0-9._-]. It is also cloud-init's instance-id when
	// MetaData is not given, and stays the same across Stop/Start.
	ID string
	// Hostname; default ID (which must then be a valid hostname).
	Hostname string
	// UserData and MetaData are written as the NoCloud seed
	// (/var/lib/cloud/seed/nocloud/{user-data,meta-data}) on the machine's disk. MetaData
	// defaults to {instance-id: ID, local-hostname: Hostname}.
	UserData, MetaData []byte
	// SeedURL, instead of UserData/MetaData: NoCloud-net seedfrom (e.g.
	// "http://10.200.0.1:8080/meta/ID/"), fetched by cloud-init over the bridge.
	SeedURL string
	// MemoryMB and CPUs limit the machine through cgroups; 0 means unlimited.
	MemoryMB int
	CPUs     float64
	// PidsMax caps the machine's processes and threads (the pids cgroup controller: a fork bomb
	// in the machine gets EAGAIN, the host keeps going). 0: Options.PidsMax; -1: no limit.
	PidsMax int
	// DiskMB, if not 0, is the machine's disk quota: its writable layer lives in an ext4 image
	// of that size (disk.go), at least MinDiskMB. 0: the state dir's filesystem is the limit.
	DiskMB int
	// Tags are kept in machine.json and returned by Info (e.g. kloud.stack, kloud.machine).
	Tags map[string]string
	// Instance names the program instance that owns the machine (kloud's instance id), kept in
	// machine.json and returned by Info. It never changes; SetTags keeps it. Optional (1-64 of
	// [A-Za-z0-9._-]): GC callers use it to leave other instances' machines alone.
	Instance string
}

// State of a machine.
type State string

// Machine states. Info derives them from the processes on the host, not from memory.
const (
	StateRunning State = "running"
	StateStopped State = "stopped"
	StateAbsent  State = "absent"
)

// Cloud-init progress in the running machine, as reported by Info.
const (
	CloudInitPending = "pending" // no stage has reported yet
	CloudInitRunning = "running"
	CloudInitDone    = "done"
	CloudInitError   = "error" // finished, with errors (see console.log / cloud-init.log)
)

// Info describes a machine.
type Info struct {
	ID       string     `json:"id"`
	Hostname string     `json:"hostname"`
	State    State      `json:"state"`
	IP       netip.Addr `json:"ip"`
	PID      int        `json:"pid,omitempty"` // the machine's PID 1, as seen from the host
	BootedAt time.Time  `json:"booted_at,omitzero"`
	// CreatedAt is when Create made the machine's record.
	CreatedAt time.Time         `json:"created_at,omitzero"`
	Tags      map[string]string `json:"tags,omitempty"`
	// Instance is Spec.Instance: who owns the machine ("" for machines made without one).
	Instance string  `json:"instance,omitempty"`
	MemoryMB int     `json:"memory_mb,omitempty"`
	CPUs     float64 `json:"cpus,omitempty"`
	DiskMB   int     `json:"disk_mb,omitempty"`
	// Disk is where the machine's disk (its writable layer) is on the host: the upper dir
	// (Dir/upper), or with a disk quota the ext4 image holding it (Dir/disk.img; disk.go).
	Disk string `json:"disk,omitempty"`
	// CloudInit is set while running: CloudInitPending, CloudInitRunning, CloudInitDone or
	// CloudInitError (read from the machine's /run/cloud-init).
	CloudInit string `json:"cloud_init,omitempty"`
	// Complete is false for a machine whose Create has not finished (or crashed); GC removes those.
	Complete bool `json:"complete"`
	// Where things are, for diagnostics: the machine dir (console.log holds init's and
	// cloud-init's output; upper/ is the disk), the network namespace name and the host veth.
	Dir      string `json:"dir,omitempty"`
	Netns    string `json:"netns,omitempty"`
	HostVeth string `json:"host_veth,omitempty"`
}

var hostnameRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$`)

// Create makes a machine: the record, the disk (overlay upper dir with the NoCloud seed), the
// network namespace and veth, the cgroups, and boots it. It returns once the machine's PID 1
// runs inside its root filesystem; cloud-init goes on in the background (watch Info.CloudInit).
// A Create that fails removes what it made. The machine outlives the calling process.
func (m *Manager) Create(ctx context.Context, spec Spec) (Info, error) {
	if err := validID(spec.ID); err != nil {
		return Info{}, err
	}
	if spec.Hostname == "" {
		spec.Hostname = spec.ID
	}
	if len(spec.Hostname) > 63 || !hostnameRE.MatchString(spec.Hostname) {
		return Info{}, fmt.Errorf("hostname %q: not a valid hostname of at most 63 characters", spec.Hostname)
	}
	if spec.SeedURL != "" && (spec.UserData != nil || spec.MetaData != nil) {
		return Info{}, errors.New("spec: give either SeedURL or UserData/MetaData")
	}
	if spec.SeedURL != "" && !strings.HasSuffix(spec.SeedURL, "/") {
		return Info{}, fmt.Errorf("seed url %q: must end with /", spec.SeedURL)
	}
	if spec.Instance != "" && !idRE.MatchString(spec.Instance) {
		return Info{}, fmt.Errorf("spec: instance %q: want 1-64 characters of [A-Za-z0-9._-]", spec.Instance)
	}
	if spec.PidsMax < -1 || (spec.PidsMax > 0 && spec.PidsMax < 16) {
		return Info{}, fmt.Errorf("spec: pids max %d: at least 16, 0 for the default or -1 for no limit", spec.PidsMax)
	}
	if spec.MemoryMB < 0 || spec.CPUs < 0 {
		return Info{}, errors.New("spec: negative memory or cpus")
	}
	if spec.CPUs > 0 && spec.CPUs < 0.01 {
		return Info{}, fmt.Errorf("spec: cpus %g: at least 0.01", spec.CPUs)
	}
	if spec.MemoryMB > 0 && spec.MemoryMB < 32 {
		return Info{}, fmt.Errorf("spec: memory %d MB: at least 32 (cloud-init alone needs more)", spec.MemoryMB)
	}
	if spec.DiskMB != 0 {
		if spec.DiskMB < MinDiskMB {
			return Info{}, fmt.Errorf("spec: disk %d MB: at least %d, or 0 for no quota", spec.DiskMB, MinDiskMB)
		}
		if err := checkDiskTools(); err != nil {
			return Info{}, err
		}
	}
	if m.baseImage == "" {
		return Info{}, errors.New("create: Options.BaseImage is not set (see EnsureBaseImage)")
	}
	if _, err := os.Stat(filepath.Join(m.baseImage, "usr/bin/cloud-init")); err != nil {
		return Info{}, fmt.Errorf("base image %s: no cloud-init: %w", m.baseImage, err)
	}
	log := m.log.With("machine", spec.ID)
	l, err := m.lockMachine(ctx, spec.ID)
	if err != nil {
		return Info{}, err
	}
	defer l.unlock()

	r, err := m.reserve(ctx, spec)
	if err != nil {
		return Info{}, err
	}

	t0 := time.Now()
	if err := m.create(ctx, r, spec); err != nil {
		log.Warn("create failed, removing the machine", "err", err)
		l.remove = true
		if derr := m.destroyLocked(context.WithoutCancel(ctx), spec.ID); derr != nil {
			log.Error("remove failed machine", "err", derr)
		}
		return Info{}, fmt.Errorf("create machine %q: %w", spec.ID, err)
	}
	log.Info("machine created", "ip", r.IP, "pid", r.PID, "took", time.Since(t0).Round(time.Millisecond))
	return m.info(r), nil
}

// reserve allocates the IP and writes the record (not yet complete) of a new machine. Call with
// the machine's lock held.
func (m *Manager) reserve(ctx context.Context, spec Spec) (*record, error) {
	g, err := m.lockGlobal(ctx)
	if err != nil {
		return nil, err
	}
	defer g.unlock()
	if _, err := os.Stat(m.machineDir(spec.ID)); err == nil {
		return nil, fmt.Errorf("machine %q: %w", spec.ID, ErrExists)
	}
	addr, err := m.allocateIP()
	if err != nil {
		return nil, err
	}
	n := m.namesFor(spec.ID)
	pidsMax := spec.PidsMax
	if pidsMax == 0 {
		pidsMax = m.pidsMax
	}
	r := &record{
		Version: recordVersion, ID: spec.ID, Hostname: spec.Hostname, Tags: spec.Tags, Instance: spec.Instance,
		MemoryMB: spec.MemoryMB, CPUs: spec.CPUs, PidsMax: pidsMax, DiskMB: spec.DiskMB, SeedURL: spec.SeedURL, CreatedAt: time.Now().UTC(),
		BaseImage: m.baseImage, IP: addr, PrefixLen: m.subnet.Bits(), Bridge: m.bridge,
		Netns: n.netns, HostVeth: n.hostVeth, PeerVeth: n.peerVeth, Cgroup: n.cgroup,
	}
	if err := m.saveLedger(r); err != nil { // before anything of the machine exists (leftovers.go)
		return nil, err
	}
	if err := os.Mkdir(m.machineDir(spec.ID), 0o700); err != nil {
		m.removeLedger(spec.ID)
		return nil, fmt.Errorf("machine dir: %w", err)
	}
	if err := m.saveRecord(r); err != nil {
		os.RemoveAll(m.machineDir(spec.ID))
		m.removeLedger(spec.ID)
		return nil, err
	}
	return r, nil
}

func (m *Manager) create(ctx context.Context, r *record, spec Spec) error {
	if err := m.prepareDisk(r, spec); err != nil {
		return err
	}
	if r.DiskMB > 0 {
		if err := makeDiskImage(ctx, m.machineDir(r.ID), r.DiskMB); err != nil {
			return err
		}
	}
	if err := m.SetupNetwork(ctx); err != nil {
		return err
	}
	if err := m.ensureMachineNetwork(ctx, r); err != nil {
		return err
	}
	if err := m.ApplyFirewall(ctx); err != nil { // before it boots: the default applies at once
		return err
	}
	if err := m.boot(ctx, r); err != nil {
		return err
	}
	r.Complete = true
	return m.saveRecord(r)
}

// prepareDisk creates upper/, work/ and rootfs/ and writes the seed and a fresh machine-id into
// the upper dir.
func (m *Manager) prepareDisk(r *record, spec Spec) error {
	dir := m.machineDir(r.ID)
	upper := filepath.Join(dir, "upper")
	for _, d := range []string{"upper", "work", "rootfs"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			return fmt.Errorf("machine disk: %w", err)
		}
	}
	write := func(rel string, data []byte, mode os.FileMode) error {
		if err := mkdirLike(upper, r.BaseImage, filepath.Dir(rel)); err != nil {
			return fmt.Errorf("machine disk: %w", err)
		}
		if err := os.WriteFile(filepath.Join(upper, rel), data, mode); err != nil {
			return fmt.Errorf("machine disk: %w", err)
		}
		return nil
	}
	id := make([]byte, 16)
	rand.Read(id)
	if err := write("etc/machine-id", []byte(hex.EncodeToString(id)+"\n"), 0o444); err != nil {
		return err
	}
	if spec.SeedURL != "" {
		cfg, _ := json.Marshal(map[string]any{"datasource": map[string]any{"NoCloud": map[string]any{"seedfrom": spec.SeedURL}}})
		return write("etc/cloud/cloud.cfg.d/90-kloud-seed.cfg", append(cfg, '\n'), 0o644)
	}
	meta := spec.MetaData
	if meta == nil {
		meta, _ = json.Marshal(map[string]string{"instance-id": r.ID, "local-hostname": r.Hostname})
		meta = append(meta, '\n')
	}
	user := spec.UserData
	if user == nil {
		user = []byte("#cloud-config\n{}\n")
	}
	if err := write("var/lib/cloud/seed/nocloud/meta-data", meta, 0o600); err != nil {
		return err
	}
	return write("var/lib/cloud/seed/nocloud/user-data", user, 0o600)
}

// mkdirLike creates upper/rel with the mode and owner the same directories have in lower, so
// the overlay does not change them.
func mkdirLike(upper, lower, rel string) error {
	cur := ""
	for _, part := range strings.Split(filepath.Clean(rel), "/") {
		if part == "." || part == "" {
			continue
		}
		cur = filepath.Join(cur, part)
		dst := filepath.Join(upper, cur)
		if _, err := os.Lstat(dst); err == nil {
			continue
		}
		mode, uid, gid := os.FileMode(0o755), 0, 0
		if st, err := os.Stat(filepath.Join(lower, cur)); err == nil && st.IsDir() {
			mode = st.Mode().Perm() | st.Mode()&os.ModeSticky
			if s, ok := st.Sys().(*syscall.Stat_t); ok {
				uid, gid = int(s.Uid), int(s.Gid)
			}
		}
		if err := os.Mkdir(dst, mode); err != nil {
			return err
		}
		if err := os.Chmod(dst, mode); err != nil { // umask
			return err
		}
		if err := os.Lchown(dst, uid, gid); err != nil {
			return err
		}
	}
	return nil
}

// boot starts the machine's PID 1 through the launcher (see init.go) and records it.
func (m *Manager) boot(ctx context.Context, r *record) error {
	procs, err := setupCgroups(r)
	if err != nil {
		return err
	}
	dir := m.machineDir(r.ID)
	console, err := os.OpenFile(filepath.Join(dir, "console.log"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("console log: %w", err)
	}
	defer console.Close()
	bc := bootConfig{
		ID: r.ID, Hostname: r.Hostname, Netns: filepath.Join(netnsDir, r.Netns), CgroupProcs: procs,
		Lower: r.BaseImage, Upper: filepath.Join(dir, "upper"), Work: filepath.Join(dir, "work"),
		Root: filepath.Join(dir, "rootfs"), StopGrace: m.stopTimeout / 2, MemoryMB: r.MemoryMB, CPUs: r.CPUs,
	}
	if r.DiskMB > 0 { // disk.go
		bc.DiskImage, bc.DiskMount = filepath.Join(dir, diskImage), filepath.Join(dir, diskMount)
		bc.Upper, bc.Work = filepath.Join(bc.DiskMount, "upper"), filepath.Join(bc.DiskMount, "work")
	}
	cfg, _ := json.Marshal(bc)
	// The launcher answers within a second or so; a binary whose main does not call MaybeRunInit
	// would instead run its ordinary main, so bound the wait and say why.
	ctx, cancel := context.WithTimeout(ctx, bootTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/proc/self/exe")
	cmd.Args = []string{"kloud-sandbox-launch", r.ID}
	cmd.Env = append([]string{envStage + "=" + stageLaunch, envConfig + "=" + string(cfg)}, selfexec.Env()...)
	cmd.Dir = "/"
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, console
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	runErr := cmd.Run()
	line := strings.TrimSpace(out.String())
	var pid int
	var start uint64
	if _, err := fmt.Sscanf(line, "ok %d %d", &pid, &start); err != nil {
		msg := strings.TrimPrefix(line, "error: ")
		if msg == "" && runErr != nil {
			msg = runErr.Error()
		}
		if line == "" {
			msg += " (no answer from the launcher: does this program's main call sandbox.MaybeRunInit() first?)"
		}
		return fmt.Errorf("boot: %s (console.log: %s)", msg, tailFile(filepath.Join(dir, "console.log"), 5))
	}
	r.PID, r.PIDStart, r.BootedAt = pid, start, time.Now().UTC()
	return m.saveRecord(r)
}

// Start boots a stopped machine again on the same disk (cloud-init keeps the instance-id, so
// only per-boot modules run). Starting a running machine just returns its Info. Start also
// recreates the bridge, namespace and veth if they are gone (after a host reboot).
func (m *Manager) Start(ctx context.Context, id string) (Info, error) {
	l, r, err := m.lockRecord(ctx, id, "start machine")
	if err != nil {
		return Info{}, err
	}
	defer l.unlock()
	if alive(r.PID, r.PIDStart) {
		return m.info(r), nil
	}
	// Whatever is left of a previous boot (an Exec'd process, say) goes first.
	if err := m.killMachine(ctx, r, 0); err != nil {
		return Info{}, fmt.Errorf("start machine %q: %w", id, err)
	}
	if err := m.SetupNetwork(ctx); err != nil {
		return Info{}, fmt.Errorf("start machine %q: %w", id, err)
	}
	if err := m.ensureMachineNetwork(ctx, r); err != nil {
		return Info{}, fmt.Errorf("start machine %q: %w", id, err)
	}
	if err := m.ApplyFirewall(ctx); err != nil {
		return Info{}, fmt.Errorf("start machine %q: %w", id, err)
	}
	if err := m.boot(ctx, r); err != nil {
		return Info{}, fmt.Errorf("start machine %q: %w", id, err)
	}
	m.log.Info("machine started", "machine", id, "pid", r.PID)
	return m.info(r), nil
}

// Stop ends every process of the machine (SIGTERM to its PID 1, which passes it on; SIGKILL
// after StopTimeout) and keeps its disk, network and cgroups. Stopping a stopped machine is a
// no-op.
func (m *Manager) Stop(ctx context.Context, id string) (Info, error) {
	l, r, err := m.lockRecord(ctx, id, "stop machine")
	if err != nil {
		return Info{}, err
	}
	defer l.unlock()
	t0 := time.Now()
	if err := m.killMachine(ctx, r, m.stopTimeout); err != nil {
		return Info{}, fmt.Errorf("stop machine %q: %w", id, err)
	}
	r.PID, r.PIDStart = 0, 0
	if err := m.saveRecord(r); err != nil {
		return Info{}, err
	}
	m.log.Info("machine stopped", "machine", id, "took", time.Since(t0).Round(time.Millisecond))
	return m.info(r), nil
}

// killMachine ends the machine's PID 1 (SIGTERM, then SIGKILL after grace; grace 0 means SIGKILL
// at once) and then every other process still in its cgroups or network namespace.
func (m *Manager) killMachine(ctx context.Context, r *record, grace time.Duration) error {
	if alive(r.PID, r.PIDStart) {
		if grace > 0 {
			kill(r.PID, unix.SIGTERM)
			waitGone(ctx, grace, func() bool { return !alive(r.PID, r.PIDStart) })
		}
		if alive(r.PID, r.PIDStart) {
			kill(r.PID, unix.SIGKILL)
		}
		if !waitGone(ctx, 10*time.Second, func() bool { return !alive(r.PID, r.PIDStart) }) {
			return fmt.Errorf("pid %d survived SIGKILL", r.PID)
		}
	}
	return killLeftovers(ctx, names{netns: r.Netns, cgroup: r.Cgroup})
}

// killLeftovers SIGKILLs every process in the machine's cgroups or network namespace.
func killLeftovers(ctx context.Context, n names) error {
	pids := func() []int {
		var ps []int
		if validMachineCgroup(n.cgroup) {
			ps = cgroupPIDs(n.cgroup)
		}
		nsPath := filepath.Join(netnsDir, n.netns)
		if validNetns(n.netns) && isNsfs(nsPath) {
			if ino, err := nsInode(nsPath); err == nil {
				ps = append(ps, pidsInNetns(ino)...)
			}
		}
		return ps
	}
	if len(pids()) == 0 {
		return nil
	}
	done := waitGone(ctx, 10*time.Second, func() bool {
		ps := pids()
		for _, p := range ps {
			kill(p, unix.SIGKILL)
		}
		return len(ps) == 0
	})
	if !done {
		return fmt.Errorf("processes %v survived SIGKILL", pids())
	}
	return nil
}

// Info reports the machine's state from its record and the live processes. An unknown id is
// State absent, not an error.
func (m *Manager) Info(ctx context.Context, id string) (Info, error) {
	if err := validID(id); err != nil {
		return Info{}, err
	}
	r, err := m.loadRecord(id)
	if errors.Is(err, fs.ErrNotExist) {
		return Info{ID: id, State: StateAbsent}, nil
	}
	if err != nil {
		return Info{}, err
	}
	return m.info(r), nil
}

func (m *Manager) info(r *record) Info {
	in := Info{
		ID: r.ID, Hostname: r.Hostname, State: StateStopped, IP: r.IP, Tags: r.Tags, Instance: r.Instance,
		MemoryMB: r.MemoryMB, CPUs: r.CPUs, DiskMB: r.DiskMB, Complete: r.Complete, CreatedAt: r.CreatedAt,
		Dir: m.machineDir(r.ID), Netns: r.Netns, HostVeth: r.HostVeth,
	}
	in.Disk = filepath.Join(in.Dir, "upper")
	if r.DiskMB > 0 {
		in.Disk = filepath.Join(in.Dir, diskImage)
	}
	if alive(r.PID, r.PIDStart) {
		in.State, in.PID, in.BootedAt = StateRunning, r.PID, r.BootedAt
		in.CloudInit = cloudInitStatus(r.PID)
	}
	return in
}

// cloudInitStatus reads cloud-init's own status files through /proc/PID/root.
func cloudInitStatus(pid int) string {
	dir := "/proc/" + strconv.Itoa(pid) + "/root/run/cloud-init/"
	b, err := os.ReadFile(dir + "result.json")
	if err != nil {
		if _, err := os.Stat(dir + "status.json"); err == nil {
			return CloudInitRunning
		}
		return CloudInitPending
	}
	var res struct {
		V1 struct {
			Errors []any `json:"errors"`
		} `json:"v1"`
	}
	if json.Unmarshal(b, &res) != nil || len(res.V1.Errors) > 0 {
		return CloudInitError
	}
	return CloudInitDone
}

// List returns every machine in the state dir, half-created ones included.
func (m *Manager) List(ctx context.Context) ([]Info, error) {
	ids, err := m.machineIDs()
	if err != nil {
		return nil, err
	}
	var out []Info
	for _, id := range ids {
		r, err := m.loadRecord(id)
		if errors.Is(err, fs.ErrNotExist) {
			out = append(out, Info{ID: id, State: StateStopped, Dir: m.machineDir(id)})
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, m.info(r))
	}
	return out, nil
}

// Destroy removes the machine: its processes, cgroups, veth, network namespace and directory
// (disk and logs). It is idempotent, and works on half-created machines too: every name it
// removes is recorded in (or derived like) machine.json before it is created.
func (m *Manager) Destroy(ctx context.Context, id string) error {
	if err := validID(id); err != nil {
		return err
	}
	l, err := m.lockMachine(ctx, id)
	if err != nil {
		return err
	}
	defer l.unlock()
	l.remove = true
	return m.destroyLocked(ctx, id)
}

func (m *Manager) destroyLocked(ctx context.Context, id string) error {
	n := m.namesFor(id)
	r, err := m.loadRecord(id)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		m.log.Warn("unreadable machine.json, removing by derived names", "machine", id, "err", err)
	}
	if r != nil {
		n = names{netns: r.Netns, hostVeth: r.HostVeth, peerVeth: r.PeerVeth, cgroup: r.Cgroup}
		if err := m.killMachine(ctx, r, 0); err != nil {
			return fmt.Errorf("destroy machine %q: %w", id, err)
		}
	} else if err := killLeftovers(ctx, n); err != nil {
		return fmt.Errorf("destroy machine %q: %w", id, err)
	}
	var errs []error
	// A cgroup whose last task just died can refuse rmdir for a moment.
	var cgErr error
	waitGone(ctx, 5*time.Second, func() bool { cgErr = removeCgroups(n.cgroup); return cgErr == nil })
	errs = append(errs, cgErr)
	errs = append(errs, m.removeMachineNetwork(ctx, n))
	dir := m.machineDir(id)
	errs = append(errs, unmountUnder(dir))
	if err := os.RemoveAll(dir); err != nil {
		errs = append(errs, fmt.Errorf("remove machine dir: %w", err))
	}
	if err := m.ApplyFirewall(ctx); err != nil { // its rules go with it
		m.log.Warn("firewall after destroy", "machine", id, "err", err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("destroy machine %q: %w", id, err) // the ledger entry says whose the rest is
	}
	if err := m.removeLedger(id); err != nil {
		return fmt.Errorf("destroy machine %q: %w", id, err)
	}
	m.log.Info("machine destroyed", "machine", id)
	return nil
}

// unmountUnder detaches any host mount at or below dir. Machines mount nothing on the host, but
// RemoveAll must never descend into a mount.
func unmountUnder(dir string) error {
	mps, err := mountsUnder(dir)
	if err != nil {
		return err
	}
	var errs []error
	for i := len(mps) - 1; i >= 0; i-- {
		if err := unix.Unmount(mps[i], unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", mps[i], err))
		}
	}
	return errors.Join(errs...)
}

// mountsUnder lists the host's mount points at or below dir, in mount order.
func mountsUnder(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	defer f.Close()
	var mps []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		mp, _, _, ok := cgroups.ParseMountinfo(sc.Text())
		if ok && (mp == dir || strings.HasPrefix(mp, dir+"/")) {
			mps = append(mps, mp)
		}
	}
	return mps, sc.Err()
}

// GC destroys every machine for which keep returns false (keep nil keeps all complete ones),
// every half-created machine (no Create holds it any more: a crash midway), and this manager's
// leftovers that no machine owns (namespaces, veths on the bridge, cgroups). It returns the ids
// of the machines it destroyed.
func (m *Manager) GC(ctx context.Context, keep func(Info) bool) ([]string, error) {
	ids, err := m.machineIDs()
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, id := range ids {
		l, err := m.lockMachine(ctx, id) // waits for a Create in progress
		if err != nil {
			return removed, err
		}
		r, err := m.loadRecord(id)
		var drop bool
		switch {
		case errors.Is(err, fs.ErrNotExist):
			_, statErr := os.Stat(m.machineDir(id))
			drop = statErr == nil // a dir without machine.json
		case err != nil:
			drop = true
		case !r.Complete:
			drop = true
		default:
			drop = keep != nil && !keep(m.info(r))
		}
		if drop {
			m.log.Info("gc: removing machine", "machine", id)
			if err := m.destroyLocked(ctx, id); err != nil {
				errs = append(errs, err)
			} else {
				removed = append(removed, id)
				l.remove = true
			}
		}
		l.unlock()
	}
	errs = append(errs, m.removeAllLeftovers(ctx)) // leftovers.go
	return removed, errors.Join(errs...)
}

// Exec runs argv inside a running machine (all its namespaces and its root, via nsenter) and
// returns its standard output; on failure the error carries standard error. For tests and
// diagnostics: the process does not join the machine's cgroups.
func (m *Manager) Exec(ctx context.Context, id string, argv ...string) ([]byte, error) {
	if err := validID(id); err != nil {
		return nil, err
	}
	if len(argv) == 0 {
		return nil, errors.New("exec: empty command")
	}
	if m.nsenterPath == "" {
		return nil, errors.New("exec: nsenter (util-linux) is not installed")
	}
	r, err := m.loadRecord(id)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("exec in machine %q: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	if !alive(r.PID, r.PIDStart) {
		return nil, fmt.Errorf("exec in machine %q: %w", id, ErrNotRunning)
	}
	// The command joins the machine's cgroups (nsenter enters namespaces only): what it starts
	// counts against the machine's limits, a fork bomb included. A shell joins them, then execs
	// nsenter.
	hs, err := cgroups.Hierarchies()
	if err != nil {
		return nil, err
	}
	args := []string{"-c", `while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"`, "kloud-exec"}
	for _, d := range cgroupDirs(hs, r.Cgroup) {
		args = append(args, filepath.Join(d, "cgroup.procs"))
	}
	args = append(args, "--", m.nsenterPath, "-t", strconv.Itoa(r.PID), "-m", "-u", "-i", "-n", "-p", "-r", "-w", "--")
	args = append(args, argv...)
	cmd := exec.CommandContext(ctx, "/bin/sh", args...)
	cmd.Env = machineEnv()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("exec %q in machine %q: %s: %w", argv, id, strings.TrimSpace(stderr.String()), err)
	}
	return stdout.Bytes(), nil
}
