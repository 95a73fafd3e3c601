// Package sandbox makes real machines on this host out of Linux namespaces: each machine has its
// own network namespace on a bridge, pid/mount/uts/ipc namespaces, an overlay disk over a shared
// Debian bookworm root filesystem, and runs real cloud-init on its user data. It backs the
// "local" provider (ARCHITECTURE.md §6): the terraform provider creates and destroys machines,
// kloud starts, stops and inspects them, each in its own process.
//
// Start reading at Manager (sandbox.go), then init.go (how a machine boots) and image.go (how
// the base image is built).
//
// # API
//
//	MaybeRunInit()                                   first statement of every main that boots machines
//	Available() error                                nil, or why machines cannot run here (not root, ...)
//	EnsureBaseImage(ctx, cacheDir, logger) (string, error)  mmdebstrap once, cached by recipe hash
//	New(Options) (*Manager, error)
//	(*Manager) SetupNetwork(ctx) / TeardownNetwork(ctx)     the bridge (Create/Start set it up too)
//	(*Manager) HostAddr() netip.Addr                 the bridge address: listen there for machines
//	(*Manager) Create(ctx, Spec) (Info, error)       disk, netns, veth, cgroups, boot; returns once PID 1 runs
//	(*Manager) Start / Stop (ctx, id) (Info, error)  boot again on the same disk / end all processes
//	(*Manager) Info(ctx, id) (Info, error)           running|stopped|absent from /proc, plus cloud-init progress
//	(*Manager) SetTags(ctx, id, tags) (Info, error)  replace the tags (running or stopped)
//	(*Manager) SetInstance(ctx, id, inst) (Info, error)  record the owner of a machine made without one
//	(*Manager) Destroy(ctx, id) error                everything, idempotent
//	(*Manager) List(ctx) / GC(ctx, keep)             GC also removes half-created machines and orphans
//	(*Manager) Leftovers(ctx) / RemoveLeftover(ctx, l)  what machines left without a record (leftovers.go)
//	(*Manager) Exec(ctx, id, argv...) ([]byte, error)  nsenter into a running machine
//
// Usage:
//
//	func main() {
//		sandbox.MaybeRunInit() // the binary re-executes itself as each machine's launcher and PID 1
//		...
//		base, err := sandbox.EnsureBaseImage(ctx, "", logger) // $KLOUD_CACHE or /var/cache/kloud
//		m, err := sandbox.New(sandbox.Options{BaseImage: base, Logger: logger})
//		err = m.SetupNetwork(ctx) // then listen on m.HostAddr()
//		info, err := m.Create(ctx, sandbox.Spec{ID: "m1", UserData: ud, MemoryMB: 512})
//		// poll m.Info until info.CloudInit is CloudInitDone
//	}
//
// # State
//
// State lives on disk only, so any number of processes can manage the same machines and a
// machine outlives the process that created it. Each machine may record the instance that owns it
// (Spec.Instance: kloud's instance id), so that several owners sharing a state dir can tell their
// machines apart (GC's keep function sees it in Info.Instance). StateDir/<id>/machine.json records every name a
// machine owns (namespace, veth, cgroup, IP) before any of it exists, plus its PID 1 and that
// process's start time. Info derives running/stopped from /proc (a reused PID is not mistaken for
// the machine); Destroy and GC clean up after a crash halfway through Create. flock(2) serialises
// work on one machine (StateDir/.locks/<id>.lock) and IP allocation (StateDir/.lock), across
// processes. Host-side names are derived from a hash of StateDir and the id, so a test run and a
// demo on the same host never collide: netns kd-<mgr6>-<id10>, host veth kdh<id10>, cgroup
// kloud/kd-<mgr6>-<id10>.
//
// # A machine
//
// The overlay (lower: the base image, upper: StateDir/<id>/upper, the machine's disk; with a
// disk quota, Spec.DiskMB, the upper dir lives in an ext4 image, see disk.go) is mounted
// inside the machine's own mount namespace, which then pivots into it, so the host's mount table
// never shows it and it vanishes with the machine's last process. Inside: /proc, a read-only
// /sys, a minimal /dev (null, zero, full, random, urandom, tty, a private devpts with ptmx),
// tmpfs /run, /tmp and /dev/shm; /proc/sys read-only except /proc/sys/net. The network namespace
// has lo and eth0 (a veth on the bridge) with a static address and only the subnet route: no
// default route, no NAT, and IPv4 forwarding off on the bridge, so a machine reaches HostAddr and
// the other machines and nothing else. PID 1 runs the four cloud-init stages in one Python
// process that imports cloud-init once (userdata.CloudInitStages; its output in
// StateDir/<id>/console.log, cloud-init's in the machine's /var/log/cloud-init*.log), reaps
// orphans and stays up; SIGTERM stops the machine. The seed is NoCloud
// (/var/lib/cloud/seed/nocloud) or NoCloud-net (Spec.SeedURL); the instance-id stays the same
// across Stop/Start, so only per-boot modules run again.
//
// cgroups: memory, cpu and pids, each from a v1 hierarchy when the host mounts one (as on our
// cgroup v1+v2 hybrid hosts, whose unified tree carries only hugetlb), else from the unified v2
// tree (memory.max, cpu.max).
//
// A machine is not a security boundary against its own root: it shares the host's user
// namespace. The capability bounding set drops module loading, raw I/O, the clock, kexec, mknod,
// audit and BPF, and the host's sysctls are read-only, which keeps honest mistakes away from the
// host; it does not make hostile code safe. Everything here needs root.
package sandbox
