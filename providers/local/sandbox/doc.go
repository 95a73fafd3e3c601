// Package sandbox makes real machines on this host out of Linux namespaces: each machine has its
// own network namespace on a bridge, pid/mount/uts/ipc namespaces, an overlay disk over a shared
// Debian bookworm root filesystem, and runs real cloud-init on its user data. It backs the
// "local" provider (ARCHITECTURE.md §6): the terraform provider creates and destroys machines,
// kloud starts, stops and inspects them, each in its own process.
//
// Start reading at Manager (sandbox.go): New, then Create, Start, Stop, Info, Destroy, List, GC
// and Exec. init.go explains how a machine boots, image.go how the base image is built.
//
// Usage:
//
//	func main() {
//		sandbox.MaybeRunInit() // first: the binary re-executes itself as each machine's PID 1
//		...
//		base, err := sandbox.EnsureBaseImage(ctx, "", logger) // cached under $KLOUD_CACHE
//		m, err := sandbox.New(sandbox.Options{BaseImage: base, Logger: logger})
//		err = m.SetupNetwork(ctx) // bridge with m.HostAddr(); listen there
//		info, err := m.Create(ctx, sandbox.Spec{ID: "m1", UserData: ud, MemoryMB: 512})
//	}
//
// State lives on disk only. StateDir/<id>/machine.json records every name a machine owns
// (namespace, veth, cgroup, IP) before any of it exists, plus its PID 1 and that process's start
// time; Info derives running/stopped from /proc (so a reused PID is not mistaken for the
// machine), and Destroy and GC can clean up after a crash halfway through Create. Machines
// outlive the process that created them. flock(2) serialises work on one machine across processes
// (StateDir/.locks/<id>.lock) and IP allocation (StateDir/.lock).
//
// A machine: the overlay (lower: base image, upper: StateDir/<id>/upper, the machine's disk) is
// mounted inside the machine's own mount namespace, which then pivots into it, so the host's mount
// table never shows it; /proc, a read-only /sys, a minimal /dev (null, zero, full, random,
// urandom, tty, a private devpts with ptmx), tmpfs /run, /tmp and /dev/shm. The network namespace
// has lo and eth0 (a veth on the bridge) with a static address and only the subnet route: no
// default route, no ip_forward, no NAT, so a machine reaches HostAddr and the other machines and
// nothing else. PID 1 runs the four cloud-init stages (output in StateDir/<id>/console.log and the
// machine's /var/log/cloud-init*.log), reaps orphans and stays up; SIGTERM stops the machine.
// cgroups: memory, cpu and pids, each from a v1 hierarchy when the host mounts one (hybrid
// hosts), else from the unified v2 tree.
//
// A machine is not a security boundary against its own root: it shares the host's user
// namespace. The capability bounding set drops module loading, raw I/O, the clock, kexec, mknod,
// audit and BPF, and /proc/sys (but /proc/sys/net) is read-only, which keeps honest mistakes away
// from the host; it does not make hostile code safe.
//
// Everything here needs root; Available says plainly what is missing.
package sandbox
