// Package sandbox runs a program unprivileged, in its own pid and mount namespaces, seeing only
// what it needs: the calling binary re-executed as a launcher. terraformer runs every terraform
// command through it (terraformer/tfsandbox, the terraform-specific layer: Terraform CLI config,
// terraform-exec), and kloud its provider plugins (kloud/pluginhost). Start reading at [MaybeRun]
// (which every program that launches through it calls first in main or TestMain) and [Config]
// (what the launcher is told); the stages are in launch.go and init.go. Below, "terraform" is
// Config.Program, whichever program that is.
//
// # Process tree
//
//	terraformer (root)
//	 └─ launcher  /proc/self/exe KLOUD_TFSANDBOX_STAGE=launch   started by terraform-exec: own
//	     │                                                      process group, Pdeathsig SIGKILL
//	     └─ init  /proc/self/exe KLOUD_TFSANDBOX_STAGE=init     PID 1 of new pid+mount+ipc+uts
//	         │                                                  namespaces, Pdeathsig SIGKILL
//	         └─ terraform (uid 65534, no capabilities)          and its providers, provisioner
//	                                                            shells, ...
//
// The launcher forwards SIGINT, SIGTERM, SIGHUP and SIGQUIT to init, init to terraform; each
// exits with its child's status (128+n for a signal). When terraformer, the launcher or init dies
// (even by SIGKILL), the kernel kills the next one down, and PID 1's death kills every process of
// its pid namespace: nothing terraform started outlives the run.
//
// # What terraform sees
//
// init makes every mount private, builds a new root on a tmpfs and pivots into it. The root holds
// only read-only binds of /usr, /bin, /sbin, /lib, /lib32, /lib64 (symlinks, as on a merged-/usr
// host, are recreated as symlinks), a generated minimal /etc (etc.go: passwd and group naming
// root, nobody/nogroup and the sandbox's user, hosts, nsswitch.conf, the host's resolv.conf and
// localtime, and read-only the host's CA certificates, ld.so.cache and alternatives; nothing else
// of the host's /etc: no shadow, ssh keys or machine-id), a fresh /proc, a minimal /dev (null, zero, full,
// random, urandom, tty; with Config.PTY also /dev/ptmx and a private /dev/pts), an empty tmpfs /tmp, and at their host paths: the terraform binary, the
// Terraform CLI config file, the provider mirror directories and plugin cache it names, extra
// read-only paths of the configuration, and the run's work directory, read-write. Nothing else
// of the host is there: not kloud's or terraformer's data directories (other stacks' state and
// variables), not /root, /home or /var. The network namespace is the host's: providers must reach
// kloud on loopback (what a template may reach is the template policy's job).
//
// terraform then runs as Config.UID/GID (default 65534, nobody/nogroup) with no supplementary
// groups, no_new_privs set, and empty capability sets (bounding, inheritable, ambient, and so
// permitted and effective), HOME=/tmp, in the work directory.
//
// # Cgroup limits
//
// With Config.Limits the launcher creates the cgroup kloud/<CgroupPrefix><run> (cpu, memory,
// pids; internal/cgroups) and joins it before it starts init, so init, terraform and everything
// they start are under those limits (a fork bomb gets EAGAIN at the pids limit); it leaves and
// removes the group when init has ended. [RemoveCgroup] and [RemoveLeftovers] remove what a
// killed launcher left (see cgroup.go).
//
// # Without namespaces
//
// Config.Insecure makes the launcher exec terraform in place, with the caller's privileges and
// view of the host. It exists for development without root (terraformer's --insecure-no-sandbox)
// and is never a fallback: without it, a host that cannot build the sandbox fails the run.
package sandbox
