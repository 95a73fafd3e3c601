package sandbox_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/providers/bridgefw"
	"github.com/kloud-dev/kloud/providers/local/sandbox"
)

// bootTimeout bounds create → cloud-init done (about 3-5 s idle; CI shares 2 cores).
const bootTimeout = 3 * time.Minute

var base struct {
	once sync.Once
	path string
	err  error
}

// baseImage builds or finds the base image once per test binary.
func baseImage(t *testing.T) string {
	t.Helper()
	base.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		base.path, base.err = sandbox.EnsureBaseImage(ctx, sandbox.DefaultCacheDir(), testutil.Logger(t))
	})
	if base.err != nil {
		if _, err := exec.LookPath("mmdebstrap"); err != nil {
			testutil.Unavailable(t, "base image not cached and mmdebstrap missing: %s", base.err)
		}
		t.Fatalf("base image: %s", base.err)
	}
	return base.path
}

type env struct {
	m        *sandbox.Manager
	stateDir string
	bridge   string
	subnet   netip.Prefix
	base     string
}

// newEnv gives the test its own manager: a fresh state dir, a unique bridge and a free
// 10.200.N.0/24, so it never touches a running demo. Cleanup removes every machine, leftover and
// the bridge, also when the test failed.
func newEnv(t *testing.T) *env {
	t.Helper()
	testutil.RequireRoot(t)
	testutil.RequireBinary(t, "ip")
	testutil.RequireBinary(t, "nsenter")
	if err := sandbox.Available(); err != nil {
		testutil.Unavailable(t, "%s", err)
	}
	e := &env{base: baseImage(t), stateDir: t.TempDir(), bridge: "kdt" + randHex(t, 4), subnet: freeSubnet(t)}
	m, err := sandbox.New(sandbox.Options{
		StateDir: e.stateDir, BaseImage: e.base, Bridge: e.bridge, Subnet: e.subnet,
		Logger: testutil.Logger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	e.m = m
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := m.GC(ctx, func(sandbox.Info) bool { return false }); err != nil {
			t.Errorf("cleanup: gc: %s", err)
		}
		if err := m.TeardownNetwork(ctx); err != nil {
			t.Errorf("cleanup: %s", err)
		}
	})
	return e
}

func randHex(t *testing.T, n int) string {
	b := make([]byte, n/2)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func (e *env) create(t *testing.T, spec sandbox.Spec) sandbox.Info {
	t.Helper()
	t0 := time.Now()
	info, err := e.m.Create(t.Context(), spec)
	if err != nil {
		t.Fatalf("create %s: %s", spec.ID, err)
	}
	t.Logf("create %s: %s (pid %d, ip %s)", spec.ID, time.Since(t0).Round(time.Millisecond), info.PID, info.IP)
	return info
}

// waitCloudInit polls Info until cloud-init finished and fails the test on errors.
func (e *env) waitCloudInit(t *testing.T, id string) sandbox.Info {
	t.Helper()
	t0 := time.Now()
	var info sandbox.Info
	testutil.Eventually(t, bootTimeout, func() bool {
		var err error
		info, err = e.m.Info(t.Context(), id)
		if err != nil {
			t.Fatal(err)
		}
		if info.State != sandbox.StateRunning {
			t.Fatalf("machine %s is %s while waiting for cloud-init:\n%s", id, info.State, e.console(id))
		}
		return info.CloudInit == sandbox.CloudInitDone || info.CloudInit == sandbox.CloudInitError
	}, "cloud-init in %s did not finish:\n%s", id, e.console(id))
	if info.CloudInit != sandbox.CloudInitDone {
		t.Fatalf("cloud-init in %s: %s\n%s", id, info.CloudInit, e.console(id))
	}
	t.Logf("cloud-init done in %s after %s", id, time.Since(t0).Round(time.Millisecond))
	return info
}

func (e *env) console(id string) string {
	b, _ := os.ReadFile(filepath.Join(e.stateDir, id, "console.log"))
	return string(b)
}

func (e *env) exec(t *testing.T, id string, argv ...string) string {
	t.Helper()
	out, err := e.m.Exec(t.Context(), id, argv...)
	if err != nil {
		t.Fatalf("exec %v: %s", argv, err)
	}
	return strings.TrimSpace(string(out))
}

// serve starts an HTTP server on addr that answers with the client's IP.
func serve(t *testing.T, addr string) string {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		fmt.Fprintf(w, "hello %s", host)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// cgroupFile reads a file of pid's cgroup for controller (v1 hierarchy if mounted, else v2).
func cgroupFile(t *testing.T, pid int, controller, v1file, v2file string) (string, string) {
	t.Helper()
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var v1mount, v2mount string
	for _, line := range strings.Split(string(mi), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		a, b := strings.Fields(pre), strings.Fields(post)
		switch {
		case b[0] == "cgroup" && strings.Contains(","+b[2]+",", ","+controller+","):
			v1mount = a[4]
		case b[0] == "cgroup2" && v2mount == "":
			v2mount = a[4]
		}
	}
	cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(cg)), "\n") {
		f := strings.SplitN(line, ":", 3)
		if v1mount != "" && strings.Contains(","+f[1]+",", ","+controller+",") {
			p := filepath.Join(v1mount, f[2])
			b, err := os.ReadFile(filepath.Join(p, v1file))
			if err != nil {
				t.Fatal(err)
			}
			return p, strings.TrimSpace(string(b))
		}
		if v1mount == "" && f[0] == "0" {
			p := filepath.Join(v2mount, f[2])
			b, err := os.ReadFile(filepath.Join(p, v2file))
			if err != nil {
				t.Fatal(err)
			}
			return p, strings.TrimSpace(string(b))
		}
	}
	t.Fatalf("pid %d: no %s cgroup", pid, controller)
	return "", ""
}

// netnsPIDs lists the processes in the network namespace mounted at /run/netns/name.
func netnsPIDs(t *testing.T, name string) []int {
	t.Helper()
	st, err := os.Stat("/run/netns/" + name)
	if err != nil {
		return nil
	}
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st2, err := os.Stat("/proc/" + e.Name() + "/ns/net"); err == nil && os.SameFile(st, st2) {
			if b, err := os.ReadFile("/proc/" + e.Name() + "/stat"); err == nil && !bytes.Contains(b[bytes.LastIndexByte(b, ')'):], []byte(") Z")) {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

func hostMountinfoMentions(t *testing.T, s string) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return out
}

func countLines(s string) int {
	n := 0
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		n++
	}
	return n
}

func TestAvailable(t *testing.T) {
	testutil.RequireRoot(t)
	if err := sandbox.Available(); err != nil {
		t.Fatal(err)
	}
}

func TestEnsureBaseImageCached(t *testing.T) {
	testutil.RequireRoot(t)
	p1 := baseImage(t)
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	st1, err := os.Stat(p1)
	if err != nil {
		t.Fatal(err)
	}
	p2, err := sandbox.EnsureBaseImage(t.Context(), sandbox.DefaultCacheDir(), logger)
	if err != nil {
		t.Fatal(err)
	}
	st2, err := os.Stat(p2)
	if err != nil {
		t.Fatal(err)
	}
	if p1 != p2 || !os.SameFile(st1, st2) {
		t.Fatalf("second EnsureBaseImage gave %s, first %s", p2, p1)
	}
	if strings.Contains(logs.String(), "building") {
		t.Fatalf("second EnsureBaseImage rebuilt:\n%s", logs.String())
	}
	for _, f := range []string{"usr/bin/cloud-init", "usr/bin/curl", "usr/bin/sudo", "usr/bin/less", "usr/sbin/ip",
		"etc/cloud/cloud.cfg.d/99-kloud-local.cfg", "lib/terminfo/x/xterm-256color"} {
		if _, err := os.Stat(filepath.Join(p2, f)); err != nil {
			t.Errorf("base image: %s", err)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(p2, "etc/resolv.conf")); bytes.Contains(b, []byte("nameserver")) {
		t.Errorf("base image carries the build host's resolv.conf: %s", b)
	}
}

func TestMachineLifecycle(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	if err := e.m.SetupNetwork(ctx); err != nil {
		t.Fatal(err)
	}
	hostSrv := serve(t, netip.AddrPortFrom(e.m.HostAddr(), 0).String())
	loopSrv := serve(t, "127.0.0.1:0")

	userData := fmt.Sprintf(`#cloud-config
users:
  - default
  - name: alice
    shell: /bin/bash
    sudo: "ALL=(ALL) NOPASSWD:ALL"
write_files:
  - path: /etc/kloud-test/marker
    content: "written by cloud-init\n"
    permissions: "0640"
bootcmd:
  - echo boot >> /var/tmp/boots
runcmd:
  - echo run >> /var/tmp/instance-runs
  - curl -sS --max-time 20 -o /var/tmp/fetched http://%s/hello
`, hostSrv)
	const id, hostname = "life-1", "kd-life-1"
	info := e.create(t, sandbox.Spec{
		ID: id, Hostname: hostname, UserData: []byte(userData), MemoryMB: 300, CPUs: 0.5,
		Tags: map[string]string{"kloud.stack": "s1", "kloud.machine": "m1"},
	})
	if info.State != sandbox.StateRunning || !e.subnet.Contains(info.IP) || info.IP == e.m.HostAddr() || !info.Complete {
		t.Fatalf("after create: %+v", info)
	}
	if info.Tags["kloud.stack"] != "s1" {
		t.Fatalf("tags: %v", info.Tags)
	}
	if _, err := e.m.Create(ctx, sandbox.Spec{ID: id}); !errors.Is(err, sandbox.ErrExists) {
		t.Fatalf("second create: %v", err)
	}
	// The machine is nobody's child here: it must outlive whoever created it.
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", info.PID)); err != nil {
		t.Fatal(err)
	} else if f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:])); f[1] == strconv.Itoa(os.Getpid()) {
		t.Fatalf("machine PID 1 is a child of the creating process")
	}

	e.waitCloudInit(t, id)
	if got := e.exec(t, id, "hostname"); got != hostname {
		t.Errorf("hostname = %q, want %q", got, hostname)
	}
	if got := e.exec(t, id, "cloud-init", "status"); !strings.Contains(got, "status: done") {
		t.Errorf("cloud-init status: %q", got)
	}
	if got := e.exec(t, id, "cat", "/etc/kloud-test/marker"); got != "written by cloud-init" {
		t.Errorf("write_files: %q", got)
	}
	e.exec(t, id, "test", "-s", "/var/log/cloud-init-output.log")
	// As cloud-init's own tee made it: umask 037, the adm group.
	if got := e.exec(t, id, "stat", "-c", "%a %G", "/var/log/cloud-init-output.log"); got != "640 adm" {
		t.Errorf("cloud-init-output.log's mode and group: %q, want \"640 adm\"", got)
	}
	// cloud-init's four stages ran in one process (userdata.CloudInitStages), each with its own
	// output redirection into cloud-init-output.log, which ended with it: no tee is left; and
	// cloud-init parsed its YAML with libyaml.
	console := e.console(id)
	for _, want := range []string{"kloud-init: cloud-init init --local: exit 0", "kloud-init: cloud-init modules --mode=final: exit 0", "kloud-init: cloud-init's stages: exit 0",
		"kloud-init: cloud-init's YAML parser: libyaml", "kloud-init: cloud-init's output: tee spawned without a fork of python"} {
		if !strings.Contains(console, want) {
			t.Errorf("console has no %q:\n%s", want, console)
		}
	}
	if strings.Contains(console, "kloud-init: run [cloud-init") {
		t.Errorf("the stages ran as four commands:\n%s", console)
	}
	output := e.exec(t, id, "cat", "/var/log/cloud-init-output.log")
	for _, stage := range []string{"init-local", "init", "modules:config", "modules:final"} {
		if !strings.Contains(output, "running '"+stage+"'") {
			t.Errorf("cloud-init-output.log has no output of stage %s:\n%s", stage, output)
		}
	}
	if ps := e.exec(t, id, "ps", "-eo", "comm="); strings.Contains(ps, "tee") || strings.Contains(ps, "python") {
		t.Errorf("processes left by cloud-init's stages:\n%s", ps)
	}
	if _, err := os.Stat(filepath.Join(info.Dir, "upper/var/log/cloud-init-output.log")); err != nil {
		t.Errorf("cloud-init-output.log not on the machine's disk: %s", err)
	}
	e.exec(t, id, "id", "alice")
	if got := e.exec(t, id, "cat", "/var/tmp/fetched"); got != "hello "+info.IP.String() {
		t.Errorf("machine → host on the bridge: %q", got)
	}
	// Nothing but the bridge subnet is reachable: no default route, host loopback is not ours.
	if got := e.exec(t, id, "ip", "-4", "route", "show"); countLines(got) != 1 || !strings.HasPrefix(got, e.subnet.String()) {
		t.Errorf("routes in machine: %q", got)
	}
	if out, err := e.m.Exec(ctx, id, "ip", "route", "get", "192.0.2.1"); err == nil {
		t.Errorf("machine has a route to 192.0.2.1: %s", out)
	}
	if out, err := e.m.Exec(ctx, id, "curl", "-sS", "--max-time", "3", "http://"+loopSrv+"/"); err == nil {
		t.Errorf("machine reached the host's loopback: %s", out)
	}
	if b, err := os.ReadFile("/proc/sys/net/ipv4/conf/" + e.bridge + "/forwarding"); err != nil || strings.TrimSpace(string(b)) != "0" {
		t.Errorf("bridge forwards IPv4: %q %v", b, err)
	}

	// Limits, read back from the cgroup the machine's PID 1 is in.
	memCg, mem := cgroupFile(t, info.PID, "memory", "memory.limit_in_bytes", "memory.max")
	if mem != strconv.Itoa(300<<20) {
		t.Errorf("memory limit %s = %s, want %d", memCg, mem, 300<<20)
	}
	if _, quota := cgroupFile(t, info.PID, "cpu", "cpu.cfs_quota_us", "cpu.max"); !strings.HasPrefix(quota, "50000") {
		t.Errorf("cpu quota = %s, want 50000", quota)
	}
	// Mounts live in the machine's namespace only.
	if ms := hostMountinfoMentions(t, e.stateDir); len(ms) > 0 {
		t.Errorf("host mount table shows machine mounts: %q", ms)
	}
	mi, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", info.PID))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(mi), " / / ") || !strings.Contains(string(mi), " - overlay overlay ") {
		t.Errorf("machine root is not the overlay:\n%s", mi)
	}

	// Stop keeps the disk.
	e.exec(t, id, "sh", "-c", "echo kept > /root/persist")
	t0 := time.Now()
	info, err = e.m.Stop(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("stop: %s", time.Since(t0).Round(time.Millisecond))
	if info.State != sandbox.StateStopped || info.PID != 0 {
		t.Fatalf("after stop: %+v", info)
	}
	if info, _ = e.m.Info(ctx, id); info.State != sandbox.StateStopped {
		t.Fatalf("info after stop: %+v", info)
	}
	if b, _ := os.ReadFile(filepath.Join(memCg, "cgroup.procs")); len(bytes.TrimSpace(b)) > 0 {
		t.Errorf("processes left in the cgroup after stop: %s", b)
	}
	if pids := netnsPIDs(t, info.Netns); len(pids) > 0 {
		t.Errorf("processes left in the netns after stop: %v", pids)
	}
	if _, err := e.m.Exec(ctx, id, "true"); !errors.Is(err, sandbox.ErrNotRunning) {
		t.Errorf("exec in stopped machine: %v", err)
	}
	if info, err = e.m.Stop(ctx, id); err != nil || info.State != sandbox.StateStopped {
		t.Fatalf("second stop: %+v %v", info, err)
	}

	// Start again: per-boot modules run, per-instance ones do not.
	t0 = time.Now()
	info, err = e.m.Start(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("start: %s", time.Since(t0).Round(time.Millisecond))
	e.waitCloudInit(t, id)
	if got := e.exec(t, id, "cat", "/root/persist"); got != "kept" {
		t.Errorf("file written before stop: %q", got)
	}
	if got := e.exec(t, id, "cat", "/var/tmp/boots"); countLines(got) != 2 {
		t.Errorf("bootcmd (per boot) ran %d times, want 2", countLines(got))
	}
	if got := e.exec(t, id, "cat", "/var/tmp/instance-runs"); countLines(got) != 1 {
		t.Errorf("runcmd (per instance) ran %d times, want 1", countLines(got))
	}
	if got := e.exec(t, id, "hostname"); got != hostname {
		t.Errorf("hostname after restart = %q", got)
	}
	if again, err := e.m.Start(ctx, id); err != nil || again.PID != info.PID {
		t.Errorf("start of a running machine: %+v %v", again, err)
	}

	// Destroy leaves nothing.
	t0 = time.Now()
	if err := e.m.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	t.Logf("destroy: %s", time.Since(t0).Round(time.Millisecond))
	e.assertGone(t, info, memCg)
	if err := e.m.Destroy(ctx, id); err != nil {
		t.Errorf("second destroy: %s", err)
	}
	if _, err := e.m.Start(ctx, id); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("start after destroy: %v", err)
	}
}

// assertGone checks that nothing of a machine is left on the host.
func (e *env) assertGone(t *testing.T, info sandbox.Info, cgroupDir string) {
	t.Helper()
	if got, err := e.m.Info(t.Context(), info.ID); err != nil || got.State != sandbox.StateAbsent {
		t.Errorf("info after destroy: %+v %v", got, err)
	}
	if _, err := os.Stat(info.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("machine dir left: %v", err)
	}
	if _, err := os.Stat("/run/netns/" + info.Netns); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("netns left: %v", err)
	}
	if _, err := os.Stat("/sys/class/net/" + info.HostVeth); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("veth %s left: %v", info.HostVeth, err)
	}
	if cgroupDir != "" {
		if _, err := os.Stat(cgroupDir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("cgroup %s left: %v", cgroupDir, err)
		}
	}
	for _, s := range []string{info.Dir, info.Netns} {
		if ms := hostMountinfoMentions(t, s); len(ms) > 0 {
			t.Errorf("host mounts left: %q", ms)
		}
	}
	if info.PID > 0 {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", info.PID)); err == nil {
			// A reused PID is possible in theory; the machine's would be in no netns of ours.
			if link, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", info.PID)); strings.Contains(link, "sandbox.test") {
				t.Errorf("machine PID 1 %d still exists", info.PID)
			}
		}
	}
}

// TestTwoMachinesPingEachOther also starts with the firewall table of a bridge of the same subnet
// that is gone (a kloud killed before it tidied): its drops would cut the machines off from each
// other (the bridge family's rules see every bridge), so setting up the network removes it.
func TestTwoMachinesPingEachOther(t *testing.T) {
	e := newEnv(t)
	if err := bridgefw.Usable(); err != nil {
		testutil.Unavailable(t, "nftables: %v", err)
	}
	stale := bridgefw.NewTable("kdg"+randHex(t, 8), e.subnet)
	t.Cleanup(func() { stale.Remove(context.Background()) })
	if err := stale.Apply(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	a := e.create(t, sandbox.Spec{ID: "ping-a"})
	b := e.create(t, sandbox.Spec{ID: "ping-b"})
	if a.IP == b.IP {
		t.Fatalf("both machines have %s", a.IP)
	}
	if ok, err := stale.Exists(); err != nil || ok {
		t.Errorf("the table of the bridge that is gone is still there (%v)", err)
	}
	e.exec(t, a.ID, "ping", "-c", "1", "-W", "5", b.IP.String())
	e.exec(t, b.ID, "ping", "-c", "1", "-W", "5", a.IP.String())
	e.exec(t, a.ID, "ping", "-c", "1", "-W", "5", e.m.HostAddr().String())
	// Host → machine, as kloud reaches klient: a server inside the machine on its address.
	e.exec(t, a.ID, "sh", "-c", "echo from-machine > /tmp/index.html; cd /tmp && "+
		"setsid python3 -m http.server --bind "+a.IP.String()+" 8080 >/dev/null 2>&1 < /dev/null &")
	var body []byte
	client := &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 5 * time.Second} // never a proxy
	testutil.Eventually(t, 30*time.Second, func() bool {
		resp, err := client.Get("http://" + a.IP.String() + ":8080/index.html")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, _ = io.ReadAll(resp.Body)
		return resp.StatusCode == http.StatusOK
	}, "host could not reach a server in the machine")
	if strings.TrimSpace(string(body)) != "from-machine" {
		t.Errorf("host → machine: %q", body)
	}
	list, err := e.m.List(t.Context())
	if err != nil || len(list) != 2 {
		t.Fatalf("list: %+v %v", list, err)
	}
}

// TestMachineOutlivesCreator creates the machine from a separate process that exits right away,
// as the terraform provider does, then manages it from this one.
func TestMachineOutlivesCreator(t *testing.T) {
	e := newEnv(t)
	job, _ := json.Marshal(creatorJob{StateDir: e.stateDir, BaseImage: e.base, Bridge: e.bridge, Subnet: e.subnet,
		Spec: sandbox.Spec{ID: "outlive", UserData: []byte("#cloud-config\nruncmd:\n  - touch /var/tmp/ran\n")}})
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), self)
	cmd.Env = append(os.Environ(), envCreator+"="+string(job))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("creator process: %s: %s", err, stderr.String())
	}
	var created sandbox.Info
	if err := json.Unmarshal(stdout.Bytes(), &created); err != nil {
		t.Fatalf("creator output %q: %s", stdout.String(), err)
	}
	info := e.waitCloudInit(t, "outlive")
	if info.PID != created.PID || info.State != sandbox.StateRunning {
		t.Fatalf("after the creator exited: %+v (created %+v)", info, created)
	}
	e.exec(t, "outlive", "test", "-f", "/var/tmp/ran")
	if err := e.m.Destroy(t.Context(), "outlive"); err != nil {
		t.Fatal(err)
	}
	e.assertGone(t, info, "")
}

func TestGCRemovesHalfCreated(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	keep := e.create(t, sandbox.Spec{ID: "gc-keep"})
	if err := sandbox.CreateHalf(ctx, e.m, sandbox.Spec{ID: "gc-half"}); err != nil {
		t.Fatal(err)
	}
	if err := sandbox.CreateHalf(ctx, e.m, sandbox.Spec{ID: "gc-lost"}); err != nil {
		t.Fatal(err)
	}
	half, err := e.m.Info(ctx, "gc-half")
	if err != nil || half.Complete || half.State != sandbox.StateStopped {
		t.Fatalf("half-created: %+v %v", half, err)
	}
	if err := sandbox.CreateHalf(ctx, e.m, sandbox.Spec{ID: "gc-anon"}); err != nil {
		t.Fatal(err)
	}
	lost, _ := e.m.Info(ctx, "gc-lost")
	anon, _ := e.m.Info(ctx, "gc-anon")
	// A process left in the half machine's namespace, as a crash after boot would leave it.
	sleeper := exec.Command("ip", "netns", "exec", half.Netns, "sleep", "600")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- sleeper.Wait() }()
	t.Cleanup(func() { sleeper.Process.Kill() })
	testutil.Eventually(t, 30*time.Second, func() bool { return len(netnsPIDs(t, half.Netns)) > 0 },
		"sleeper did not enter netns %s", half.Netns)
	// A machine whose directory vanished: its namespace, veth and cgroup are orphans.
	if err := os.RemoveAll(lost.Dir); err != nil {
		t.Fatal(err)
	}
	// One whose ledger entry went too: its parts are leftovers without an id (no machine named).
	if err := os.RemoveAll(anon.Dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(e.stateDir, ".ledger", "gc-anon.json")); err != nil {
		t.Fatal(err)
	}
	if los, err := e.m.Leftovers(ctx); err != nil || !slices.ContainsFunc(los, func(lo sandbox.Leftover) bool { return lo.ID == "" && lo.Netns == anon.Netns }) {
		t.Fatalf("leftovers: %+v %v, want gc-anon's without an id", los, err)
	}

	removed, err := e.m.GC(ctx, func(in sandbox.Info) bool { return in.ID == "gc-keep" })
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 1 || removed[0] != "gc-half" {
		t.Errorf("gc removed %v, want [gc-half]", removed)
	}
	select {
	case <-waited:
	case <-time.After(10 * time.Second):
		t.Errorf("process in the half-created machine's netns survived gc")
	}
	e.assertGone(t, half, "")
	e.assertGone(t, lost, "")
	e.assertGone(t, anon, "")
	if los, err := e.m.Leftovers(ctx); err != nil || len(los) != 0 {
		t.Errorf("leftovers after gc: %+v %v", los, err)
	}
	for _, rel := range []string{sandbox.CgroupOf(e.m, "gc-half"), sandbox.CgroupOf(e.m, "gc-lost"), sandbox.CgroupOf(e.m, "gc-anon")} {
		for _, h := range []string{"memory", "pids", "cpu"} {
			if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", h, rel)); err == nil {
				t.Errorf("cgroup %s/%s left", h, rel)
			}
		}
	}
	if in, _ := e.m.Info(ctx, "gc-keep"); in.State != sandbox.StateRunning || in.PID != keep.PID {
		t.Errorf("gc touched a kept machine: %+v", in)
	}
	if removed, err := e.m.GC(ctx, nil); err != nil || len(removed) != 0 {
		t.Errorf("gc(nil) removed %v, %v", removed, err)
	}
	if removed, err := e.m.GC(ctx, func(sandbox.Info) bool { return false }); err != nil || len(removed) != 1 {
		t.Errorf("gc(none) removed %v, %v", removed, err)
	}
	e.assertGone(t, keep, "")
}

// TestSeedURL delivers user data the way a cloud's metadata service does: NoCloud-net fetches it
// from a server on the bridge address.
func TestSeedURL(t *testing.T) {
	e := newEnv(t)
	if err := e.m.SetupNetwork(t.Context()); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var fetched []string
	mux := http.NewServeMux()
	mux.HandleFunc("/meta/seeded/{file}", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		fetched = append(fetched, r.PathValue("file"))
		mu.Unlock()
		switch r.PathValue("file") {
		case "meta-data":
			fmt.Fprint(w, "instance-id: seeded-1\nlocal-hostname: from-seed\n")
		case "user-data":
			fmt.Fprint(w, "#cloud-config\nruncmd:\n  - echo seeded > /var/tmp/seeded\n")
		case "vendor-data":
			fmt.Fprint(w, "")
		default:
			http.NotFound(w, r)
		}
	})
	ln, err := net.Listen("tcp", netip.AddrPortFrom(e.m.HostAddr(), 0).String())
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	e.create(t, sandbox.Spec{ID: "seeded", SeedURL: "http://" + ln.Addr().String() + "/meta/seeded/"})
	e.waitCloudInit(t, "seeded")
	if got := e.exec(t, "seeded", "cat", "/var/tmp/seeded"); got != "seeded" {
		t.Errorf("runcmd from the seed url: %q", got)
	}
	if got := e.exec(t, "seeded", "hostname"); got != "from-seed" {
		t.Errorf("hostname from the seed's meta-data: %q", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(strings.Join(fetched, ","), "user-data") {
		t.Errorf("seed server saw %v", fetched)
	}
	if _, err := e.m.Create(t.Context(), sandbox.Spec{ID: "bad", SeedURL: "http://x/", UserData: []byte("{}")}); err == nil {
		t.Error("create with both SeedURL and UserData succeeded")
	}
}

// TestConcurrentCreates races several Creates (separate lock files, as separate processes would
// use them) for addresses.
func TestConcurrentCreates(t *testing.T) {
	e := newEnv(t)
	const n = 4
	infos := make([]sandbox.Info, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			infos[i], errs[i] = e.m.Create(t.Context(), sandbox.Spec{ID: fmt.Sprintf("conc-%d", i)})
		})
	}
	wg.Wait()
	seen := map[netip.Addr]string{}
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("create conc-%d: %s", i, errs[i])
		}
		if other, dup := seen[infos[i].IP]; dup {
			t.Errorf("conc-%d and %s both got %s", i, other, infos[i].IP)
		}
		seen[infos[i].IP] = infos[i].ID
	}
}

// TestStartRecreatesNetwork starts a machine whose bridge, veth and namespace are gone, as after
// a host reboot (/run/netns is a tmpfs).
func TestStartRecreatesNetwork(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	info := e.create(t, sandbox.Spec{ID: "reboot"})
	if _, err := e.m.Stop(ctx, "reboot"); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"netns", "del", info.Netns}, {"link", "del", e.bridge}} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %s: %s", args, err, out)
		}
	}
	info, err := e.m.Start(ctx, "reboot")
	if err != nil {
		t.Fatal(err)
	}
	if info.State != sandbox.StateRunning {
		t.Fatalf("after start: %+v", info)
	}
	e.exec(t, "reboot", "ping", "-c", "1", "-W", "5", e.m.HostAddr().String())
}

func freeSubnet(t *testing.T) netip.Prefix {
	t.Helper()
	p, release, err := sandbox.FreeSubnet(16)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	return p
}

// TestFreeSubnetReserves: a subnet FreeSubnet returned is nobody else's until it is released,
// also in another process (the reservation is the kernel's, not this package's).
func TestFreeSubnetReserves(t *testing.T) {
	p, release, err := sandbox.FreeSubnet(254) // the one choice: 10.200.254.0/24
	if err != nil {
		t.Fatalf("10.200.254.0/24 is not free on this host: %v", err)
	}
	if _, _, err := sandbox.FreeSubnet(254); err == nil {
		t.Fatalf("%s was returned twice", p)
	}
	release()
	q, release, err := sandbox.FreeSubnet(254)
	if err != nil || q != p {
		t.Fatalf("after release: %s %v, want %s", q, err, p)
	}
	release()
}

// TestSubnetTakenIsRefused: another link already holding an address of the machines' subnet (a
// second kloud's bridge) would take the replies to this bridge's machines. SetupNetwork says
// which, and adds nothing.
func TestSubnetTakenIsRefused(t *testing.T) {
	e := newEnv(t)
	other := "kdx" + randHex(t, 4)
	if out, err := exec.Command("ip", "link", "add", other, "type", "bridge").CombinedOutput(); err != nil {
		t.Fatalf("ip link add: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "link", "del", other).Run() })
	addr := netip.PrefixFrom(e.subnet.Addr().Next().Next(), e.subnet.Bits()).String()
	if out, err := exec.Command("ip", "addr", "add", addr, "dev", other).CombinedOutput(); err != nil {
		t.Fatalf("ip addr add: %v: %s", err, out)
	}
	err := e.m.SetupNetwork(t.Context())
	if err == nil || !strings.Contains(err.Error(), other) || !strings.Contains(err.Error(), "--local-subnet") {
		t.Fatalf("SetupNetwork with %s on %s: %v", addr, other, err)
	}
	if b, _ := exec.Command("ip", "-4", "addr", "show", "dev", e.bridge).Output(); strings.Contains(string(b), "inet ") {
		t.Errorf("the bridge got an address anyway:\n%s", b)
	}
}
