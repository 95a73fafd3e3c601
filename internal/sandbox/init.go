package sandbox

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// stagingDir is where init builds the new root before pivoting into it. Any directory that
// always exists and that none of the bound paths live under will do; the tmpfs on it is visible
// only in init's own mount namespace.
const stagingDir = "/sys"

// systemDirs are bound read-only (or recreated as the same symlinks) when the host has them.
// /etc is not among them: the sandbox gets its own (etc.go).
var systemDirs = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}

var devices = []string{"null", "zero", "full", "random", "urandom", "tty"}

// runInit is stage 2, PID 1 of the new namespaces: build the root, drop privileges, start
// terraform, forward signals, reap, and exit with terraform's status.
func runInit() int {
	// The capability bounding set and no_new_privs are per thread and inherited by a child forked
	// from that thread: set them, and start terraform, on this one.
	runtime.LockOSThread()
	cfg, err := readConfig()
	if err != nil {
		return fail(err)
	}
	signals := make(chan os.Signal, 16)
	signal.Notify(signals, append([]os.Signal{syscall.SIGCHLD}, forwarded...)...)

	if err := buildRoot(cfg); err != nil {
		return fail(fmt.Errorf("build the sandbox root: %w", err))
	}
	dir := "/tmp"
	if cfg.WorkDir != "" {
		dir = cfg.WorkDir
	}
	if err := dropPrivileges(); err != nil {
		return fail(err)
	}
	env := append(filterEnv(envWithout(false), "HOME", "TMPDIR", "PWD", "OLDPWD", "USER", "LOGNAME", "GORACE"),
		"HOME=/tmp", "TMPDIR=/tmp")
	p, err := os.StartProcess(cfg.Program, append([]string{cfg.Program}, os.Args[1:]...), &os.ProcAttr{
		Dir:   dir,
		Env:   env,
		Files: []*os.File{os.Stdin, os.Stdout, os.Stderr},
		Sys: &syscall.SysProcAttr{
			Credential: &syscall.Credential{Uid: uint32(cfg.UID), Gid: uint32(cfg.GID), Groups: []uint32{}},
		},
	})
	if err != nil {
		return fail(fmt.Errorf("start terraform as uid %d: %w", cfg.UID, err))
	}
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			_ = p.Signal(sig)
			continue
		}
		// Reap every zombie (orphans are re-parented to us); terraform's end is ours.
		for {
			var ws unix.WaitStatus
			pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
			if err != nil || pid <= 0 {
				break
			}
			if pid == p.Pid {
				if ws.Signaled() {
					return 128 + int(ws.Signal())
				}
				return ws.ExitStatus()
			}
		}
	}
	return 125
}

func filterEnv(env []string, drop ...string) []string {
	var out []string
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if !containsString(drop, name) {
			out = append(out, kv)
		}
	}
	return out
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// buildRoot makes the mounts private, assembles the new root on a tmpfs and pivots into it.
func buildRoot(cfg *Config) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	root := stagingDir
	if err := unix.Mount("tfsandbox", root, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,size=16m"); err != nil {
		return fmt.Errorf("mount root tmpfs: %w", err)
	}
	for _, d := range systemDirs {
		fi, err := os.Lstat(d)
		if err != nil {
			continue
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(d)
			if err != nil {
				return err
			}
			if err := os.Symlink(target, root+d); err != nil {
				return err
			}
		case fi.IsDir():
			if err := os.Mkdir(root+d, 0o755); err != nil {
				return err
			}
			if err := bind(d, root+d, true); err != nil {
				return err
			}
		}
	}
	if err := buildEtc(root, cfg); err != nil {
		return fmt.Errorf("build /etc: %w", err)
	}
	if err := os.Mkdir(root+"/proc", 0o555); err != nil {
		return err
	}
	if err := unix.Mount("proc", root+"/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /proc: %w", err)
	}
	if err := buildDev(root+"/dev", cfg.PTY); err != nil {
		return err
	}
	if err := os.Mkdir(root+"/tmp", 0o1777); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", root+"/tmp", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777,size=512m"); err != nil {
		return fmt.Errorf("mount /tmp: %w", err)
	}
	for _, p := range append([]string{cfg.Program}, cfg.ReadOnly...) {
		resolved, err := mkTarget(root, p)
		if err != nil {
			return fmt.Errorf("read-only path %s: %w", p, err)
		}
		if err := bind(resolved, root+resolved, true); err != nil {
			return err
		}
	}
	if cfg.WorkDir != "" {
		resolved, err := mkTarget(root, cfg.WorkDir)
		if err != nil {
			return fmt.Errorf("work dir %s: %w", cfg.WorkDir, err)
		}
		if err := bind(resolved, root+resolved, false); err != nil {
			return err
		}
	}
	if err := os.Chdir(root); err != nil {
		return err
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the old root: %w", err)
	}
	if err := os.Chdir("/"); err != nil {
		return err
	}
	if err := unix.Mount("", "/", "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("make the root read-only: %w", err)
	}
	return nil
}

func buildDev(dev string, pty bool) error {
	if err := os.Mkdir(dev, 0o755); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", dev, "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=0755,size=64k"); err != nil {
		return fmt.Errorf("mount /dev: %w", err)
	}
	for _, d := range devices {
		if err := os.WriteFile(filepath.Join(dev, d), nil, 0o644); err != nil {
			return err
		}
		if err := unix.Mount("/dev/"+d, filepath.Join(dev, d), "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind /dev/%s: %w", d, err)
		}
	}
	for name, target := range map[string]string{"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0",
		"stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"} {
		if err := os.Symlink(target, filepath.Join(dev, name)); err != nil {
			return err
		}
	}
	if pty {
		// A new devpts instance: the sandbox's own terminals, none of the host's; ptmx opens it.
		if err := os.Mkdir(filepath.Join(dev, "pts"), 0o755); err != nil {
			return err
		}
		if err := unix.Mount("devpts", filepath.Join(dev, "pts"), "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"); err != nil {
			return fmt.Errorf("mount /dev/pts: %w", err)
		}
		if err := os.Symlink("pts/ptmx", filepath.Join(dev, "ptmx")); err != nil {
			return err
		}
	}
	return unix.Mount("", dev, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NOEXEC, "")
}

// bind mounts src on dst (recursively), read-only or not; never with set-uid or device files.
func bind(src, dst string, readOnly bool) error {
	if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s: %w", src, err)
	}
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
	flags := uintptr(unix.MS_REMOUNT | unix.MS_BIND | unix.MS_NOSUID | unix.MS_NODEV)
	if readOnly {
		attr.Attr_set |= unix.MOUNT_ATTR_RDONLY
		flags |= unix.MS_RDONLY
	}
	err := unix.MountSetattr(unix.AT_FDCWD, dst, unix.AT_RECURSIVE, attr)
	if errors.Is(err, unix.ENOSYS) { // before Linux 5.12: the top mount only
		err = unix.Mount("", dst, "", flags, "")
	}
	if err != nil {
		return fmt.Errorf("restrict %s: %w", dst, err)
	}
	return nil
}

// mkTarget recreates host path p under root as a mount point: directories as directories,
// symlinks as the same symlinks (and follows them on the host), the last element as an empty
// file or directory. It returns p with every symlink resolved: where the bind goes.
func mkTarget(root, p string) (string, error) {
	cur := "/"
	rest := strings.Split(filepath.Clean(p), "/")
	hops := 0
	for len(rest) > 0 {
		name := rest[0]
		rest = rest[1:]
		switch name {
		case "", ".":
			continue
		case "..":
			cur = filepath.Dir(cur)
			continue
		}
		next := filepath.Join(cur, name)
		fi, err := os.Lstat(next)
		if err != nil {
			return "", err
		}
		in := filepath.Join(root, next)
		_, inErr := os.Lstat(in)
		missing := errors.Is(inErr, fs.ErrNotExist)
		if fi.Mode()&fs.ModeSymlink != 0 {
			if hops++; hops > 40 {
				return "", fmt.Errorf("%s: %w", p, unix.ELOOP)
			}
			target, err := os.Readlink(next)
			if err != nil {
				return "", err
			}
			if missing {
				if err := os.Symlink(target, in); err != nil {
					return "", err
				}
			}
			if filepath.IsAbs(target) {
				cur = "/"
			}
			rest = append(strings.Split(target, "/"), rest...)
			continue
		}
		if missing {
			if fi.IsDir() {
				err = os.Mkdir(in, 0o755)
			} else {
				err = os.WriteFile(in, nil, 0o644)
			}
			if err != nil {
				return "", err
			}
		}
		cur = next
	}
	return cur, nil
}

// dropPrivileges empties this thread's capability bounding, ambient and inheritable sets and sets
// no_new_privs. The child then drops its uid (os.StartProcess's Credential): a non-root uid with
// an empty bounding set and no_new_privs has no capabilities after execve.
func dropPrivileges() error {
	for c := 0; ; c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
			if errors.Is(err, unix.EINVAL) && c > 0 {
				break // past the kernel's last capability
			}
			return fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("clear ambient capabilities: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	data[0].Inheritable, data[1].Inheritable = 0, 0
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("clear inheritable capabilities: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	return nil
}
