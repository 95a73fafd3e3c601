// Package testdockerd starts a private Docker daemon for a test: its own data root, exec root and
// socket under a run directory, no iptables rules, no bridge (containers use the host's network),
// stopped and unmounted when the test ends. The host's own dockerd is never used.
//
// Start with Start; Daemon.Import loads the Debian base image (scripts/base-image.sh,
// $KLOUD_BASE_IMAGE) as a Docker image.
package testdockerd

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
)

// Daemon is a running private dockerd.
type Daemon struct {
	// Host is the DOCKER_HOST of the daemon (unix://<dir>/d.sock).
	Host string
	// Dir holds everything of the daemon (data root, exec root, socket, log).
	Dir string
	pid int
}

// Env is the environment entry that points docker (and Vagrant's docker provider) at the daemon.
func (d *Daemon) Env() string { return "DOCKER_HOST=" + d.Host }

// Start starts a daemon and stops it when the test ends (SIGTERM, which stops its containers;
// then its mounts under Dir are unmounted and Dir removed). It needs root, dockerd and docker;
// without them the test is skipped (fails under CI=true).
func Start(t testing.TB) *Daemon {
	t.Helper()
	testutil.RequireRoot(t)
	dockerd := testutil.RequireBinary(t, "dockerd")
	testutil.RequireBinary(t, "docker")
	dir, remove, err := testutil.RunDir("dockerd")
	if err != nil {
		t.Fatal(err)
	}
	d := &Daemon{Dir: dir, Host: "unix://" + filepath.Join(dir, "d.sock")}
	logf, err := os.Create(filepath.Join(dir, "dockerd.log"))
	if err != nil {
		remove()
		t.Fatal(err)
	}
	cmd := exec.Command(dockerd, "--iptables=false", "--ip6tables=false", "--bridge=none",
		"--data-root", filepath.Join(dir, "data"), "--exec-root", filepath.Join(dir, "exec"),
		"-H", d.Host, "--pidfile", filepath.Join(dir, "d.pid"))
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		logf.Close()
		remove()
		t.Fatalf("start dockerd: %v", err)
	}
	d.pid = cmd.Process.Pid
	done := make(chan error, 1)
	go func() { done <- cmd.Wait(); logf.Close() }()
	t.Cleanup(func() {
		syscall.Kill(d.pid, syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Errorf("dockerd (pid %d) did not stop in 30 s; killing it", d.pid)
			syscall.Kill(-d.pid, syscall.SIGKILL)
			<-done
		}
		if err := unmountUnder(dir); err != nil {
			t.Errorf("unmount dockerd's leftovers: %v", err)
		}
		remove()
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		if out, err := d.docker(context.Background(), "version", "--format", "{{.Server.Version}}"); err == nil {
			t.Logf("private dockerd %s (pid %d) at %s", strings.TrimSpace(out), d.pid, d.Host)
			return d
		}
		select {
		case err := <-done:
			log, _ := os.ReadFile(filepath.Join(dir, "dockerd.log"))
			t.Fatalf("dockerd exited (%v): %s", err, tailString(string(log), 2000))
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "dockerd.log"))
			t.Fatalf("dockerd did not answer in 60 s: %s", tailString(string(log), 2000))
		}
	}
}

func tailString(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func (d *Daemon) docker(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "docker", args...)
	cmd.Env = append(os.Environ(), d.Env())
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("docker %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// Docker runs the docker CLI against the daemon and returns its output; an error fails the test.
// It works in a cleanup too (its context is its own, 2 minutes).
func (d *Daemon) Docker(t testing.TB, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := d.docker(ctx, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Import makes the Debian base image ($KLOUD_BASE_IMAGE, cloud-init inside) the daemon's image
// name (docker import of a tar of it). Without the base image the test is skipped (fails under
// CI=true).
func (d *Daemon) Import(t testing.TB, name string) {
	t.Helper()
	base := os.Getenv("KLOUD_BASE_IMAGE")
	if base == "" {
		testutil.Unavailable(t, "KLOUD_BASE_IMAGE is not set (scripts/setup.sh builds the base image; source /var/cache/kloud/env)")
	}
	if _, err := os.Stat(filepath.Join(base, "usr/bin/cloud-init")); err != nil {
		testutil.Unavailable(t, "base image %s has no cloud-init: %v", base, err)
	}
	t0 := time.Now()
	tar := exec.CommandContext(t.Context(), "tar", "-C", base, "-c", ".")
	imp := exec.CommandContext(t.Context(), "docker", "import", "-", name)
	imp.Env = append(os.Environ(), d.Env())
	pipe, err := tar.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	imp.Stdin = pipe
	if err := tar.Start(); err != nil {
		t.Fatal(err)
	}
	out, err := imp.CombinedOutput()
	terr := tar.Wait()
	if err != nil || terr != nil {
		t.Fatalf("docker import %s: %v (tar: %v): %s", name, err, terr, out)
	}
	t.Logf("imported %s as %s in %s", base, name, time.Since(t0).Round(time.Millisecond))
}

// Containers lists the names of all containers of the daemon (running or not).
func (d *Daemon) Containers(t testing.TB) []string {
	t.Helper()
	out := strings.Fields(d.Docker(t, "ps", "-a", "--format", "{{.Names}}"))
	sort.Strings(out)
	return out
}

// unmountUnder unmounts every mount point under dir (deepest first): dockerd leaves its netns
// mount under the exec root, and a killed daemon its overlays.
func unmountUnder(dir string) error {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	defer f.Close()
	var points []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		p := unescape(fields[4])
		if p == dir || strings.HasPrefix(p, dir+"/") {
			points = append(points, p)
		}
	}
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	var errs []error
	for _, p := range points {
		if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("%s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

// unescape decodes mountinfo's octal escapes (\040 for a space, ...).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
