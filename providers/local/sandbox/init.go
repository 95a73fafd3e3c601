package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kloud-dev/kloud/internal/selfexec"
	"github.com/kloud-dev/kloud/userdata"
)

// How a machine boots (runc style: the calling binary re-executes itself):
//
//	caller (kloud, the terraform provider, a test)        host namespaces
//	 └─ /proc/self/exe  KLOUD_SANDBOX_STAGE=launch          "launcher": joins the machine's cgroups,
//	     │                                                  setns(netns) on a locked thread, forks:
//	     └─ /proc/self/exe  KLOUD_SANDBOX_STAGE=init        "init", PID 1 of new pid/mount/uts/ipc
//	          └─ python3 -c userdata.CloudInitStages        namespaces, in its own session:
//	               (init --local, init, modules --mode=config, modules --mode=final: cloud-init's
//	               four stages in one process, each as `cloud-init <stage>` runs it; the four
//	               commands themselves when the image's python3 cannot import cloud-init)
//
// The launcher reports "ok PID START" once init has mounted the overlay and pivoted into it, then
// exits, so init is re-parented to the host's init (or nearest subreaper): the machine never dies
// with, nor becomes a zombie of, the process that started it (no Pdeathsig). Init mounts
// everything inside its own private mount namespace, so nothing appears in the host's mount table
// and all of it vanishes with the machine's last process.

const (
	envStage  = "KLOUD_SANDBOX_STAGE"
	envConfig = "KLOUD_SANDBOX_CONFIG"

	stageLaunch = "launch"
	stageInit   = "init"
)

// machineEnv is the environment of cloud-init and of Exec'd commands.
func machineEnv() []string {
	return []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"LANG=C.UTF-8",
		"HOME=/root",
	}
}

// bootConfig is what the launcher and init are told (as JSON in KLOUD_SANDBOX_CONFIG).
type bootConfig struct {
	ID          string        `json:"id"`
	Hostname    string        `json:"hostname"`
	Netns       string        `json:"netns"`        // /run/netns/NAME
	CgroupProcs []string      `json:"cgroup_procs"` // cgroup.procs files to join
	Lower       string        `json:"lower"`
	Upper       string        `json:"upper"`
	Work        string        `json:"work"`
	Root        string        `json:"root"` // overlay mount point (only mounted inside the machine)
	StopGrace   time.Duration `json:"stop_grace"`
	// MemoryMB and CPUs are the machine's limits, shown inside it (limits.go); cgroups enforce them.
	MemoryMB int     `json:"memory_mb,omitempty"`
	CPUs     float64 `json:"cpus,omitempty"`
	// DiskImage, if set, is loop-mounted on DiskMount before the overlay (disk.go).
	DiskImage string `json:"disk_image,omitempty"`
	DiskMount string `json:"disk_mount,omitempty"`
}

// MaybeRunInit must be the first statement of main() in every program that creates or starts
// machines (kloud, the terraform provider, test binaries via TestMain). In a normal run it returns
// at once. When the program was re-executed by this package as a machine's launcher or PID 1, it
// does that job and never returns.
func MaybeRunInit() {
	switch os.Getenv(envStage) {
	case stageLaunch:
		os.Exit(runLauncher())
	case stageInit:
		runInit()
		os.Exit(1)
	}
}

func readBootConfig() (*bootConfig, error) {
	var c bootConfig
	if err := json.Unmarshal([]byte(os.Getenv(envConfig)), &c); err != nil {
		return nil, fmt.Errorf("parse %s: %w", envConfig, err)
	}
	return &c, nil
}

// runLauncher is the middle process: it places itself in the machine's cgroups and network
// namespace, starts init in fresh namespaces, waits for init's setup report, prints
// "ok PID START" (or "error: ...") on stdout and exits.
func runLauncher() int {
	fail := func(err error) int {
		fmt.Printf("error: %s\n", err)
		return 1
	}
	cfg, err := readBootConfig()
	if err != nil {
		return fail(err)
	}
	for _, p := range cfg.CgroupProcs {
		if err := os.WriteFile(p, []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
			return fail(fmt.Errorf("join cgroup: %w", err))
		}
	}
	// setns(CLONE_NEWNET) only moves the calling thread; fork from that same locked thread.
	runtime.LockOSThread()
	nsfd, err := unix.Open(cfg.Netns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fail(fmt.Errorf("open netns: %w", err))
	}
	if err := unix.Setns(nsfd, unix.CLONE_NEWNET); err != nil {
		return fail(fmt.Errorf("setns: %w", err))
	}
	unix.Close(nsfd)

	syncR, syncW, err := os.Pipe()
	if err != nil {
		return fail(fmt.Errorf("pipe: %w", err))
	}
	cmd := exec.Command("/proc/self/exe")
	cmd.Args = []string{"kloud-init", cfg.ID}
	cmd.Env = append([]string{envStage + "=" + stageInit, envConfig + "=" + os.Getenv(envConfig)}, selfexec.Env()...)
	cmd.Dir = "/"
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr // the machine's console.log
	cmd.ExtraFiles = []*os.File{syncW}            // fd 3: init's setup report
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: unix.CLONE_NEWPID | unix.CLONE_NEWNS | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC,
		Setsid:     true,
	}
	if err := cmd.Start(); err != nil {
		return fail(fmt.Errorf("start init: %w", err))
	}
	syncW.Close()
	msg, _ := io.ReadAll(syncR)
	if string(msg) != "ok" {
		if len(msg) == 0 {
			msg = []byte("init exited during setup (see console.log)")
		}
		cmd.Process.Kill()
		cmd.Wait()
		return fail(errors.New(string(msg)))
	}
	pid := cmd.Process.Pid
	_, start, err := procStat(pid)
	if err != nil {
		return fail(fmt.Errorf("init pid %d: %w", pid, err))
	}
	cmd.Process.Release()
	fmt.Printf("ok %d %d\n", pid, start)
	return 0
}

func initLog(format string, args ...any) {
	fmt.Fprintf(os.Stdout, "%s kloud-init: %s\n", time.Now().UTC().Format(time.RFC3339Nano), fmt.Sprintf(format, args...))
}

// runInit is the machine's PID 1.
func runInit() {
	// Children are forked from this thread only: it carries the reduced capability bounding set.
	runtime.LockOSThread()
	if os.Getpid() != 1 {
		// Only ever PID 1 of a fresh pid namespace: shutdown's kill(-1) would hit the whole host.
		fmt.Fprintf(os.Stderr, "kloud-init: %s=%s set, but this is not PID 1 of a new pid namespace\n", envStage, stageInit)
		os.Exit(2)
	}
	syncW := os.NewFile(3, "sync")
	cfg, err := readBootConfig()
	if err == nil {
		err = setupMachine(cfg)
	}
	if err != nil {
		initLog("setup: %s", err)
		fmt.Fprint(syncW, err.Error())
		os.Exit(1)
	}
	if err := limitAffinity(cfg.CPUs); err != nil { // on the locked thread every process is forked from
		initLog("%s (nproc shows the host's CPUs)", err)
	}
	fmt.Fprint(syncW, "ok")
	syncW.Close()
	initLog("machine %s (%s) up", cfg.ID, cfg.Hostname)

	r := &reaper{waiting: map[int]chan unix.WaitStatus{}}
	sigs := make(chan os.Signal, 32)
	signal.Notify(sigs, unix.SIGCHLD, unix.SIGTERM, unix.SIGINT, unix.SIGHUP)
	go func() {
		for s := range sigs {
			switch s {
			case unix.SIGCHLD:
				r.reap()
			case unix.SIGTERM, unix.SIGINT:
				// SIGINT: reboot(2) with POWER_OFF/HALT from inside a pid namespace arrives as SIGINT.
				shutdown(r, cfg.StopGrace, s)
			}
		}
	}()

	devnull, err := os.Open("/dev/null")
	if err != nil {
		initLog("open /dev/null: %s", err)
		os.Exit(1)
	}
	runCloudInit(r, []*os.File{devnull, os.Stdout, os.Stdout})
	initLog("cloud-init finished")
	for {
		time.Sleep(time.Minute)
		r.reap() // in case a SIGCHLD was lost
	}
}

// runCloudInit runs cloud-init's four boot stages: in one Python process (userdata.CloudInitStages,
// which imports cloud-init once instead of four times), or, when the image's python3 cannot
// import cloud-init, as the four `cloud-init` commands.
func runCloudInit(r *reaper, files []*os.File) {
	t0 := time.Now()
	initLog("run cloud-init's stages in one process")
	ws, err := r.run("/usr/bin/python3", []string{"python3", "-c", userdata.CloudInitStages, "kloud-init"}, files)
	switch {
	case err != nil:
		initLog("python3: %s", err)
	case ws.ExitStatus() == userdata.StagesUnavailable:
	default:
		initLog("cloud-init's stages: exit %d after %s", ws.ExitStatus(), time.Since(t0).Round(time.Millisecond))
		return
	}
	for _, stage := range [][]string{
		{"cloud-init", "init", "--local"},
		{"cloud-init", "init"},
		{"cloud-init", "modules", "--mode=config"},
		{"cloud-init", "modules", "--mode=final"},
	} {
		t0 := time.Now()
		initLog("run %v", stage)
		ws, err := r.run("/usr/bin/cloud-init", stage, files)
		if err != nil {
			initLog("%v: %s", stage, err)
			continue
		}
		initLog("%v: exit %d after %s", stage, ws.ExitStatus(), time.Since(t0).Round(time.Millisecond))
	}
}

// setupMachine builds the machine's filesystem tree inside init's new mount namespace and
// switches into it.
func setupMachine(cfg *bootConfig) error {
	unix.Umask(0)
	defer unix.Umask(0o022)
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	if err := mountDisk(cfg); err != nil {
		return err
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", cfg.Lower, cfg.Upper, cfg.Work)
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := unix.Mount("overlay", cfg.Root, "overlay", 0, opts)
		if err == nil {
			break
		}
		// The previous boot's mount can stay busy for a moment after its namespace died.
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			return fmt.Errorf("mount overlay: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	root := cfg.Root
	for _, d := range []string{"proc", "sys", "dev", "run", "tmp"} {
		// Refuse symlinks: the disk is writable from inside the machine.
		st, err := os.Lstat(filepath.Join(root, d))
		if err != nil || !st.IsDir() {
			return fmt.Errorf("rootfs: /%s is not a directory", d)
		}
	}
	const nosuidNodevNoexec = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	mounts := []struct {
		src, dst, fstype string
		flags            uintptr
		data             string
	}{
		{"proc", "proc", "proc", nosuidNodevNoexec, ""},
		{"sysfs", "sys", "sysfs", nosuidNodevNoexec | unix.MS_RDONLY, ""},
		{"tmpfs", "dev", "tmpfs", unix.MS_NOSUID | unix.MS_NOEXEC, "mode=755,size=1m"},
		{"tmpfs", "run", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=755,size=64m"},
		{"tmpfs", "tmp", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777"},
	}
	for _, mt := range mounts {
		if err := unix.Mount(mt.src, filepath.Join(root, mt.dst), mt.fstype, mt.flags, mt.data); err != nil {
			return fmt.Errorf("mount /%s: %w", mt.dst, err)
		}
	}
	dev := filepath.Join(root, "dev")
	for _, n := range []struct {
		name         string
		major, minor uint32
	}{{"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7}, {"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0}} {
		if err := unix.Mknod(filepath.Join(dev, n.name), unix.S_IFCHR|0o666, int(unix.Mkdev(n.major, n.minor))); err != nil {
			return fmt.Errorf("mknod /dev/%s: %w", n.name, err)
		}
	}
	for _, d := range []struct {
		name string
		mode uint32
	}{{"pts", 0o755}, {"shm", 0o1777}} {
		if err := unix.Mkdir(filepath.Join(dev, d.name), d.mode); err != nil {
			return fmt.Errorf("mkdir /dev/%s: %w", d.name, err)
		}
	}
	if err := unix.Mount("devpts", filepath.Join(dev, "pts"), "devpts", unix.MS_NOSUID|unix.MS_NOEXEC,
		"newinstance,ptmxmode=0666,mode=0620,gid=5"); err != nil {
		return fmt.Errorf("mount /dev/pts: %w", err)
	}
	if err := unix.Mount("shm", filepath.Join(dev, "shm"), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"); err != nil {
		return fmt.Errorf("mount /dev/shm: %w", err)
	}
	for name, target := range map[string]string{
		"ptmx": "pts/ptmx", "fd": "/proc/self/fd",
		"stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2",
	} {
		if err := os.Symlink(target, filepath.Join(dev, name)); err != nil {
			return fmt.Errorf("symlink /dev/%s: %w", name, err)
		}
	}
	if err := unix.Mkdir(filepath.Join(root, "run", "lock"), 0o1777); err != nil {
		return fmt.Errorf("mkdir /run/lock: %w", err)
	}
	if err := showLimits(cfg, root); err != nil {
		return err
	}
	if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
		return fmt.Errorf("sethostname: %w", err)
	}
	if err := pivotInto(root); err != nil {
		return err
	}
	// The host's kernel tunables stay read-only; the machine's own network ones stay writable.
	for _, b := range []struct {
		path string
		ro   bool
	}{{"/proc/sys", true}, {"/proc/sys/net", false}, {"/proc/sysrq-trigger", true}} {
		if _, err := os.Stat(b.path); errors.Is(err, os.ErrNotExist) {
			continue // kernels without sysrq
		}
		if err := unix.Mount(b.path, b.path, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind %s: %w", b.path, err)
		}
		flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | nosuidNodevNoexec)
		if b.ro {
			flags |= unix.MS_RDONLY
		}
		if err := unix.Mount("", b.path, "", flags, ""); err != nil {
			return fmt.Errorf("remount %s: %w", b.path, err)
		}
	}
	// Root inside a machine shares the host's user namespace: take away what would reach the host
	// kernel or its devices (modules, raw I/O, clock, kexec, new device nodes, audit, BPF).
	for _, c := range []int{unix.CAP_SYS_MODULE, unix.CAP_SYS_RAWIO, unix.CAP_SYS_TIME, unix.CAP_SYS_BOOT,
		unix.CAP_MKNOD, unix.CAP_MAC_ADMIN, unix.CAP_MAC_OVERRIDE, unix.CAP_SYSLOG, unix.CAP_WAKE_ALARM,
		unix.CAP_BLOCK_SUSPEND, unix.CAP_AUDIT_CONTROL, unix.CAP_SYS_PACCT, unix.CAP_BPF, unix.CAP_PERFMON} {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("drop capability %d: %w", c, err)
		}
	}
	return nil
}

// pivotInto makes root the root of the mount namespace and detaches the host's tree.
func pivotInto(root string) error {
	oldroot, err := unix.Open("/", unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open /: %w", err)
	}
	defer unix.Close(oldroot)
	newroot, err := unix.Open(root, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open rootfs: %w", err)
	}
	defer unix.Close(newroot)
	if err := unix.Fchdir(newroot); err != nil {
		return fmt.Errorf("chdir rootfs: %w", err)
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		// pivot_root is refused when the host root is the initramfs; fall back to move + chroot.
		if err := unix.Mount(root, "/", "", unix.MS_MOVE, ""); err != nil {
			return fmt.Errorf("pivot_root and move: %w", err)
		}
		if err := unix.Chroot("."); err != nil {
			return fmt.Errorf("chroot: %w", err)
		}
		return unix.Chdir("/")
	}
	// The old root is now stacked under "/": detach it (and every host mount with it).
	if err := unix.Fchdir(oldroot); err != nil {
		return fmt.Errorf("chdir old root: %w", err)
	}
	if err := unix.Mount("", ".", "", unix.MS_SLAVE|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("old root slave: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach old root: %w", err)
	}
	return unix.Chdir("/")
}

// reaper waits for every child of PID 1 (orphans included) and hands exit statuses of the
// processes init started itself to whoever waits for them.
type reaper struct {
	mu      sync.Mutex
	waiting map[int]chan unix.WaitStatus
}

// run starts argv and waits for it. The reaper's lock is held across the start, so the child
// cannot be reaped before it is registered.
func (r *reaper) run(path string, argv []string, files []*os.File) (unix.WaitStatus, error) {
	r.mu.Lock()
	p, err := os.StartProcess(path, argv, &os.ProcAttr{Dir: "/", Env: machineEnv(), Files: files})
	if err != nil {
		r.mu.Unlock()
		return 0, err
	}
	ch := make(chan unix.WaitStatus, 1)
	r.waiting[p.Pid] = ch
	p.Release()
	r.mu.Unlock()
	r.reap() // its SIGCHLD may already have been handled
	return <-ch, nil
}

// reap collects every exited child; it reports whether children remain.
func (r *reaper) reap() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil { // ECHILD: none left
			return false
		}
		if pid == 0 {
			return true
		}
		if ch, ok := r.waiting[pid]; ok {
			ch <- ws
			delete(r.waiting, pid)
		}
	}
}

// shutdown terminates every process of the machine and exits, which ends the namespaces.
func shutdown(r *reaper, grace time.Duration, sig os.Signal) {
	if os.Getpid() != 1 {
		os.Exit(2)
	}
	initLog("%s: stopping all processes", sig)
	unix.Kill(-1, unix.SIGTERM)
	if grace <= 0 {
		grace = 5 * time.Second
	}
	deadline := time.Now().Add(grace)
	for r.reap() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if r.reap() {
		initLog("killing what is left after %s", grace)
		unix.Kill(-1, unix.SIGKILL)
		for r.reap() {
			time.Sleep(10 * time.Millisecond)
		}
	}
	initLog("stopped")
	os.Exit(0)
}
