package userdata

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
)

// trickyURL must reach klient byte for byte and must not be expanded by any shell.
const trickyURL = "http://127.0.0.1:9/kite?q='$(touch${IFS}pwned)';x=$HOME&y=\"z\"`touch${IFS}pwned2`"

// fakeMachine runs the generated user data on the host the way cloud-init would (write_files,
// then runcmd), with every machine path under a temporary root, against a klient served by an
// httptest server on 127.0.0.1. The "klient" is a shell script that records its arguments and
// sleeps.
type fakeMachine struct {
	t       *testing.T
	root    string // machine paths live under it
	report  string // the fake klient writes args and starts here
	srv     *httptest.Server
	sum     string // sha256 of the served klient
	klient  []byte
	binPath string // prepended to PATH (fake systemctl)

	mu   sync.Mutex
	hits map[string]int
}

func newFakeMachine(t *testing.T) *fakeMachine {
	t.Helper()
	for _, b := range []string{"bash", "curl", "sha256sum", "setsid", "nohup"} {
		testutil.RequireBinary(t, b)
	}
	m := &fakeMachine{t: t, root: t.TempDir(), report: t.TempDir(), hits: map[string]int{}}
	m.klient = []byte(fmt.Sprintf(`#!/bin/sh
# fake klient for package userdata tests
printf '%%s\n' "$@" >%[1]s/args.tmp && mv %[1]s/args.tmp %[1]s/args
echo $$ >>%[1]s/starts
echo "fake klient started"
exec sleep 600
`, m.report))
	s := sha256.Sum256(m.klient)
	m.sum = hex.EncodeToString(s[:])
	m.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.mu.Lock()
		m.hits[r.URL.Path]++
		m.mu.Unlock()
		if r.URL.Path != "/dl/klient" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(m.klient)
	}))
	t.Cleanup(m.srv.Close)
	// Registered after the TempDirs, so it runs before they are removed.
	t.Cleanup(m.killSupervisor)
	return m
}

func (m *fakeMachine) path(p string) string { return m.root + p }

func (m *fakeMachine) config() Config {
	c := baseConfig()
	c.KontrolURL = trickyURL
	c.KlientURL = m.srv.URL + "/dl/klient?x='$(touch${IFS}pwned3)'"
	c.KlientSHA256 = m.sum
	return c
}

func (m *fakeMachine) hitsFor(path string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.hits[path]
}

// provision renders c for the fake root and plays cloud-init: write_files, then runcmd. It
// returns the combined output and exit code of runcmd.
func (m *fakeMachine) provision(c Config) (string, int) {
	t := m.t
	t.Helper()
	out, err := render(c, options{root: m.root, attempts: 2, firstDelay: 0, maxDelay: 0})
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	provisionOf(t, out) // bash -n
	cfg := parseRendered(t, out)
	files, _ := cfg["write_files"].([]any)
	for _, f := range files {
		e := f.(map[string]any)
		p := e["path"].(string)
		if !strings.HasPrefix(p, m.root+"/") {
			t.Fatalf("write_files path %s escapes the test root", p)
		}
		content := []byte(e["content"].(string))
		if e["encoding"] == "b64" {
			if content, err = base64.StdEncoding.DecodeString(string(content)); err != nil {
				t.Fatal(err)
			}
		}
		perm, err := strconv.ParseUint(e["permissions"].(string), 8, 32)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, content, fs.FileMode(perm)); err != nil {
			t.Fatal(err)
		}
	}
	runcmd, _ := cfg["runcmd"].([]any)
	if len(runcmd) != 1 {
		t.Fatalf("runcmd = %#v, want only provision.sh", runcmd)
	}
	var args []string
	for _, a := range runcmd[0].([]any) {
		args = append(args, a.(string))
	}
	if !reflect.DeepEqual(args, []string{m.path(ProvisionScriptPath)}) {
		t.Fatalf("runcmd[0] = %q", args)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var res []byte
	for {
		cmd := exec.CommandContext(ctx, args[0], args[1:]...)
		cmd.Dir = m.root // a shell injection of "touch pwned" would land here
		cmd.Env = os.Environ()
		if m.binPath != "" {
			cmd.Env = append(cmd.Env, "PATH="+m.binPath+":"+os.Getenv("PATH"))
		}
		cmd.WaitDelay = 10 * time.Second // fails the run if a detached process kept our pipe
		res, err = cmd.CombinedOutput()
		// A file this process just wrote can be briefly "busy" for exec while another test's
		// fork still holds its descriptor (golang/go#22315); try again until the deadline.
		if !errors.Is(err, syscall.ETXTBSY) || ctx.Err() != nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	rc := 0
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		rc = ee.ExitCode()
	case err != nil:
		t.Fatalf("run provision.sh: %v\n%s", err, res)
	}
	t.Logf("provision.sh exit %d, output:\n%s", rc, res)
	m.checkNoInjection()
	return string(res), rc
}

func (m *fakeMachine) checkNoInjection() {
	m.t.Helper()
	for _, f := range []string{"pwned", "pwned2", "pwned3"} {
		if _, err := os.Stat(filepath.Join(m.root, f)); err == nil {
			m.t.Errorf("shell injection: %s was created", f)
		}
	}
}

// killSupervisor kills the fallback restart loop's process group (loop, klient, its sleep).
func (m *fakeMachine) killSupervisor() {
	b, err := os.ReadFile(m.path(SupervisorPIDPath))
	if err != nil {
		return
	}
	if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 1 {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
}

func (m *fakeMachine) read(p string) string {
	m.t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		m.t.Fatal(err)
	}
	return string(b)
}

func (m *fakeMachine) exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func (m *fakeMachine) starts() []string {
	b, _ := os.ReadFile(filepath.Join(m.report, "starts"))
	return strings.Fields(string(b))
}

func (m *fakeMachine) provisionStatus() ProvisionStatus {
	m.t.Helper()
	var s ProvisionStatus
	if err := json.Unmarshal([]byte(m.read(m.path(ProvisionStatusPath))), &s); err != nil {
		m.t.Fatalf("provision.status: %v", err)
	}
	return s
}

// alive reports whether pid runs (zombies count as dead).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && i+2 < len(s) && s[i+2] != 'Z' && s[i+2] != 'X'
}

func steps(ms []Marker) []string {
	var out []string
	for _, mk := range ms {
		out = append(out, mk.Step+"="+mk.Status)
	}
	return out
}

// checkMarkers compares the marker sequence in out with want and checks provision.log has the
// same markers.
func (m *fakeMachine) checkMarkers(out string, want ...string) []Marker {
	m.t.Helper()
	got := ParseMarkers([]byte(out))
	if !reflect.DeepEqual(steps(got), want) {
		m.t.Errorf("markers = %q, want %q", steps(got), want)
	}
	logged := ParseMarkers([]byte(m.read(m.path(ProvisionLogPath))))
	if !reflect.DeepEqual(logged, got) {
		m.t.Errorf("provision.log markers %q differ from stdout markers %q", steps(logged), steps(got))
	}
	return got
}

var upToStart = []string{
	"download=start", "download=ok", "verify=start", "verify=ok", "install=start", "install=ok",
	"start-klient=start", "start-klient=ok",
}

func TestProvisionChecksumMismatch(t *testing.T) {
	t.Parallel()
	m := newFakeMachine(t)
	c := m.config()
	c.KlientSHA256 = strings.Repeat("ab", 32)
	out, rc := m.provision(c)
	if rc == 0 {
		t.Fatal("provision.sh succeeded with a wrong checksum")
	}
	ms := m.checkMarkers(out, "download=start", "download=ok", "verify=start", "verify=failed")
	if last := ms[len(ms)-1]; !strings.Contains(last.Detail, "sha256 mismatch: got "+m.sum+", want "+c.KlientSHA256) {
		t.Errorf("verify detail = %q", last.Detail)
	}
	if st := m.provisionStatus(); st.Step != StepVerify || st.Status != StatusFailed || st.Time.IsZero() {
		t.Errorf("provision.status = %+v", st)
	}
	entries, err := os.ReadDir(m.path("/opt/kloud/bin"))
	if err != nil || len(entries) != 0 {
		t.Errorf("/opt/kloud/bin should be empty (no klient, no temp file): %v %v", entries, err)
	}
	if m.exists(m.path(SupervisorPIDPath)) || m.exists(filepath.Join(m.report, "args")) {
		t.Error("klient was started after a failed verification")
	}
}

func TestProvisionDownloadFails(t *testing.T) {
	t.Parallel()
	m := newFakeMachine(t)
	c := m.config()
	c.KlientURL = m.srv.URL + "/dl/missing"
	out, rc := m.provision(c)
	if rc == 0 {
		t.Fatal("provision.sh succeeded without klient")
	}
	ms := m.checkMarkers(out, "download=start", "download=failed")
	if d := ms[1].Detail; d != "curl exit code 22 after 2 attempts" {
		t.Errorf("download detail = %q", d)
	}
	if n := m.hitsFor("/dl/missing"); n != 2 {
		t.Errorf("server saw %d requests, want 2 attempts", n)
	}
	if !strings.Contains(out, "download attempt 1 failed (curl exit code 22), retrying") {
		t.Error("no retry line in the output")
	}
	if st := m.provisionStatus(); st.Step != StepDownload || st.Status != StatusFailed {
		t.Errorf("provision.status = %+v", st)
	}
}

func TestProvisionStartsKlientWithoutSystemd(t *testing.T) {
	t.Parallel()
	m := newFakeMachine(t)
	out, rc := m.provision(m.config())
	if rc != 0 {
		t.Fatalf("provision.sh exit %d", rc)
	}
	ms := m.checkMarkers(out, append(upToStart, "done=ok")...)
	if d := ms[7].Detail; !strings.HasPrefix(d, "supervisor pid ") || !strings.HasSuffix(d, "(no systemd)") {
		t.Errorf("start-klient detail = %q", d)
	}
	if m.hitsFor("/dl/klient") != 1 {
		t.Errorf("klient downloaded %d times", m.hitsFor("/dl/klient"))
	}
	bin := m.path(KlientPath)
	if got := m.read(bin); got != string(m.klient) {
		t.Error("installed klient differs from the served one")
	}
	if fi, err := os.Stat(bin); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("klient mode: %v %v", fi, err)
	}

	argsFile := filepath.Join(m.report, "args")
	testutil.Eventually(t, 20*time.Second, func() bool { return m.exists(argsFile) }, "klient did not start")
	wantArgs := []string{"--kite-key", m.path(KiteKeyPath), "--kontrol-url", trickyURL}
	if got := strings.Split(strings.TrimSuffix(m.read(argsFile), "\n"), "\n"); !reflect.DeepEqual(got, wantArgs) {
		t.Errorf("klient args = %q, want %q", got, wantArgs)
	}
	testutil.Eventually(t, 10*time.Second, func() bool {
		b, _ := os.ReadFile(m.path(KlientLogPath))
		return strings.Contains(string(b), "fake klient started")
	}, "klient output not in klient.log")
	if st := m.provisionStatus(); st.Step != StepDone || st.Status != StatusOK {
		t.Errorf("provision.status = %+v", st)
	}
	if m.exists(m.path(UserScriptStatusPath)) {
		t.Error("user-script.status written without a user script")
	}
	start := m.read(m.path(StartKlientPath))
	bashSyntax(t, start)
	bashSyntax(t, m.read(m.path(RunKlientPath)))
	if m.read(m.path(PerBootScriptPath)) != start {
		t.Error("per-boot script differs from start-klient.sh")
	}

	// The restart loop brings klient back when it dies.
	testutil.Eventually(t, 10*time.Second, func() bool { return len(m.starts()) == 1 }, "klient start not recorded")
	pid, err := strconv.Atoi(m.starts()[0])
	if err != nil || pid <= 1 {
		t.Fatalf("klient pid %q: %v", m.starts()[0], err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 20*time.Second, func() bool { return len(m.starts()) == 2 }, "klient was not restarted")

	// start-klient.sh (what cloud-init runs at every later boot) replaces a running loop.
	oldSup, _ := strconv.Atoi(strings.TrimSpace(m.read(m.path(SupervisorPIDPath))))
	oldKlient, _ := strconv.Atoi(m.starts()[1])
	cmd := exec.Command(m.path(StartKlientPath))
	cmd.Dir = m.root
	if res, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("start-klient.sh: %v\n%s", err, res)
	}
	newSup, _ := strconv.Atoi(strings.TrimSpace(m.read(m.path(SupervisorPIDPath))))
	if newSup == oldSup || !alive(newSup) {
		t.Errorf("supervisor pid %d -> %d (alive %v)", oldSup, newSup, alive(newSup))
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return !alive(oldSup) && !alive(oldKlient) }, "old supervisor or klient still running")
	testutil.Eventually(t, 20*time.Second, func() bool { return len(m.starts()) == 3 }, "klient not started by the new loop")
}

func TestProvisionUserScript(t *testing.T) {
	tests := []struct {
		name     string
		script   string // @STATUS@ = user-script.status path
		rc       int
		state    string
		markers  []string
		contains []string // in stdout and user-script.log
	}{
		{"ok", "#!/bin/bash\necho \"user out owner=$KLOUD_OWNER cwd=$PWD\"\ncat @STATUS@\n", 0, UserScriptDone,
			append(upToStart, "user-script=start", "user-script=ok", "done=ok"),
			[]string{"user out owner=alice cwd=/", `{"state":"running","startedAt":"`}},
		{"fails", "#!/bin/sh\necho failing on stderr >&2\nexit 3\n", 3, UserScriptFailed,
			append(upToStart, "user-script=start", "user-script=failed", "done=failed"),
			[]string{"failing on stderr"}},
		{"no shebang runs with bash", "echo \"bash=${BASH_VERSINFO[0]}\"\n", 0, UserScriptDone,
			append(upToStart, "user-script=start", "user-script=ok", "done=ok"),
			[]string{"bash=5"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := newFakeMachine(t)
			c := m.config()
			c.UserData = strings.ReplaceAll(tc.script, "@STATUS@", m.path(UserScriptStatusPath))
			out, rc := m.provision(c)
			if rc != tc.rc {
				t.Errorf("provision.sh exit %d, want %d", rc, tc.rc)
			}
			ms := m.checkMarkers(out, tc.markers...)
			if tc.rc != 0 {
				if d := ms[len(ms)-2].Detail; d != fmt.Sprintf("exit code %d", tc.rc) {
					t.Errorf("user-script detail = %q", d)
				}
			}
			userLog := m.read(m.path(UserScriptLogPath))
			for _, s := range tc.contains {
				if !strings.Contains(out, s) || !strings.Contains(userLog, s) {
					t.Errorf("%q missing from stdout or user-script.log:\n%s", s, userLog)
				}
			}
			var st UserScriptStatus
			raw := m.read(m.path(UserScriptStatusPath))
			if err := json.Unmarshal([]byte(raw), &st); err != nil {
				t.Fatalf("user-script.status %q: %v", raw, err)
			}
			if st.State != tc.state || st.ExitCode == nil || *st.ExitCode != tc.rc || st.StartedAt.IsZero() ||
				st.FinishedAt == nil || st.FinishedAt.Before(st.StartedAt) {
				t.Errorf("user-script.status = %s", raw)
			}
			// klient was started before the user script ran, and keeps running when it fails.
			testutil.Eventually(t, 20*time.Second, func() bool { return len(m.starts()) == 1 }, "klient not running")
		})
	}
}

func TestProvisionWithSystemd(t *testing.T) {
	t.Parallel()
	m := newFakeMachine(t)
	if err := os.MkdirAll(m.path("/run/systemd/system"), 0o755); err != nil {
		t.Fatal(err)
	}
	m.binPath = t.TempDir()
	calls := filepath.Join(m.report, "systemctl")
	fake := fmt.Sprintf("#!/bin/sh\necho \"$*\" >>%s\n", calls)
	if err := os.WriteFile(filepath.Join(m.binPath, "systemctl"), []byte(fake), 0o755); err != nil {
		t.Fatal(err)
	}
	out, rc := m.provision(m.config())
	if rc != 0 {
		t.Fatalf("provision.sh exit %d", rc)
	}
	ms := m.checkMarkers(out, append(upToStart, "done=ok")...)
	if d := ms[7].Detail; d != "systemd unit kloud-klient.service" {
		t.Errorf("start-klient detail = %q", d)
	}
	wantCalls := "daemon-reload\nenable kloud-klient.service\nrestart kloud-klient.service\n"
	if got := m.read(calls); got != wantCalls {
		t.Errorf("systemctl calls:\n%s\nwant:\n%s", got, wantCalls)
	}
	unit := m.read(m.path(KlientUnitPath))
	for _, s := range []string{"ExecStart=" + m.path(RunKlientPath) + "\n", "Restart=always\n", "KillMode=process\n", "WantedBy=multi-user.target\n"} {
		if !strings.Contains(unit, s) {
			t.Errorf("unit lacks %q:\n%s", s, unit)
		}
	}
	if m.exists(m.path(SupervisorPIDPath)) || m.exists(m.path(PerBootScriptPath)) || m.exists(m.path(StartKlientPath)) {
		t.Error("fallback supervisor set up although systemd is present")
	}

	// What systemd would run.
	run := m.path(RunKlientPath)
	bashSyntax(t, m.read(run))
	cmd := exec.Command(run)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	argsFile := filepath.Join(m.report, "args")
	testutil.Eventually(t, 20*time.Second, func() bool { return m.exists(argsFile) }, "run-klient.sh did not start klient")
	wantArgs := []string{"--kite-key", m.path(KiteKeyPath), "--kontrol-url", trickyURL}
	if got := strings.Split(strings.TrimSuffix(m.read(argsFile), "\n"), "\n"); !reflect.DeepEqual(got, wantArgs) {
		t.Errorf("klient args = %q, want %q", got, wantArgs)
	}
}
