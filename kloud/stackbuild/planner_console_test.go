package stackbuild_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kloud/stackbuild"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/userdata"
)

// A kite key's shape (userdata checks the form, nobody verifies it here).
const fakeKey = "eyJhbGciOiJFZERTQSJ9.eyJzdWIiOiJhbGljZSJ9.c2ln"

// bootMachine is a "machine" whose file system is a directory of the test: userdata's real
// provisioning script (RenderScript, the same provision.sh cloud-init runs) runs in it, and its
// console is root/var/log/cloud-init-output.log, as for the dummy provider.
type bootMachine struct {
	t    *testing.T
	root string
}

// boot renders the provisioning for cfg and starts it (it goes on in the background).
func boot(t *testing.T, cfg userdata.Config) *bootMachine {
	t.Helper()
	for _, b := range []string{"bash", "curl", "sha256sum", "setsid", "nohup", "base64"} {
		testutil.RequireBinary(t, b)
	}
	m := &bootMachine{t: t, root: t.TempDir()}
	if cfg.Username == "" {
		cfg.Username = "alice"
	}
	cfg.KiteKey, cfg.KontrolURL = fakeKey, "http://127.0.0.1:9/kite"
	script, err := userdata.RenderScript(cfg, m.root)
	if err != nil {
		t.Fatal(err)
	}
	// Registered after TempDir, so it runs before the directory is removed.
	t.Cleanup(m.kill)
	if out, err := exec.Command("/bin/bash", "-c", string(script)).CombinedOutput(); err != nil {
		t.Fatalf("boot script: %v\n%s", err, out)
	}
	return m
}

func (m *bootMachine) kill() {
	for _, p := range []string{userdata.ProvisionPIDPath, userdata.SupervisorPIDPath} {
		b, err := os.ReadFile(filepath.Join(m.root, p))
		if err != nil {
			continue
		}
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 1 {
			syscall.Kill(-pid, syscall.SIGKILL)
		}
	}
}

func (m *bootMachine) console() string {
	b, _ := os.ReadFile(filepath.Join(m.root, userdata.CloudInitOutputPath))
	return string(b)
}

// ConsoleLog makes it a provider.ConsoleLogger, as the dummy provider's machines are.
func (m *bootMachine) ConsoleLog(context.Context) (string, error) { return m.console(), nil }

func (m *bootMachine) Start(context.Context) (any, error) { return nil, nil }
func (m *bootMachine) Stop(context.Context) (any, error)  { return nil, nil }
func (m *bootMachine) Info(context.Context) (provider.State, any, error) {
	return provider.Running, nil, nil
}

// waitFailure polls the console like the planner does until ParseBootFailure reports a failure.
func (m *bootMachine) waitFailure(within time.Duration) (*stackbuild.BootFailure, time.Duration) {
	m.t.Helper()
	start := time.Now()
	for time.Since(start) < within {
		if f := stackbuild.ParseBootFailure(m.console()); f != nil {
			return f, time.Since(start)
		}
		time.Sleep(100 * time.Millisecond)
	}
	m.t.Fatalf("no failure found in the console within %s:\n%s", within, m.console())
	return nil, 0
}

// refusingURL is a loopback URL nothing listens on: connections are refused.
func refusingURL(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "http://" + addr + "/dl/klient"
}

// klientServer serves a fake klient (a script that sleeps) and returns its URL and sha256.
func klientServer(t *testing.T) (url, sum string) {
	klient := []byte("#!/bin/sh\necho fake klient\nexec sleep 600\n")
	s := sha256.Sum256(klient)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(klient) }))
	t.Cleanup(srv.Close)
	return srv.URL + "/dl/klient", hex.EncodeToString(s[:])
}

func TestParseBootFailureDownloadRefused(t *testing.T) {
	t.Parallel()
	url := refusingURL(t)
	m := boot(t, userdata.Config{KlientURL: url, KlientSHA256: strings.Repeat("a", 64)})
	f, took := m.waitFailure(20 * time.Second)
	t.Logf("after %s: %v", took, f)
	if took > 6*time.Second {
		t.Errorf("a refused download was recognised after %s (provision.sh retries for ~90s; want seconds)", took)
	}
	if f.Step != stackbuild.StepDownload || f.Marker != userdata.StepDownload || !f.Retrying || f.Attempts < stackbuild.DownloadFailuresToFail {
		t.Errorf("failure %+v", f)
	}
	for _, w := range []string{url, "curl exit code 7", "curl: (7)", "is kloud listening on an address the machine can reach"} {
		if !strings.Contains(f.Error(), w) {
			t.Errorf("%q does not say %q", f.Error(), w)
		}
	}
	if !strings.HasPrefix(f.Error(), "agent download failed inside the machine") {
		t.Errorf("error %q does not name the step first", f.Error())
	}
}

func TestParseBootFailureChecksum(t *testing.T) {
	t.Parallel()
	url, _ := klientServer(t)
	m := boot(t, userdata.Config{KlientURL: url, KlientSHA256: strings.Repeat("0", 64)})
	f, _ := m.waitFailure(20 * time.Second)
	if f.Step != stackbuild.StepDownload || f.Marker != userdata.StepVerify || f.Retrying || !strings.Contains(f.Detail, "sha256 mismatch") {
		t.Errorf("failure %+v", f)
	}
}

func TestParseBootFailureUserScript(t *testing.T) {
	t.Parallel()
	url, sum := klientServer(t)
	m := boot(t, userdata.Config{KlientURL: url, KlientSHA256: sum, UserData: "#!/bin/bash\necho boom-42 >&2\nexit 3\n"})
	f, _ := m.waitFailure(20 * time.Second)
	if f.Step != stackbuild.StepUserScript || f.Marker != userdata.StepUserScript || f.Detail != "exit code 3" {
		t.Errorf("failure %+v", f)
	}
	if !strings.Contains(m.console(), "boom-42") {
		t.Errorf("the user script's output is not in the console:\n%s", m.console())
	}
}

func TestParseBootFailureSuccess(t *testing.T) {
	t.Parallel()
	url, sum := klientServer(t)
	m := boot(t, userdata.Config{KlientURL: url, KlientSHA256: sum, UserData: "#!/bin/bash\necho fine\n"})
	testutil.Eventually(t, 20*time.Second, func() bool {
		return strings.Contains(m.console(), "KLOUD-PROVISION step=done status=ok")
	}, "provisioning did not finish:\n%s", m.console)
	if f := stackbuild.ParseBootFailure(m.console()); f != nil {
		t.Fatalf("a good boot read as failed: %v\n%s", f, m.console())
	}
}

// TestParseBootFailureCloudInit: cloud-init finished, but provision.sh never ran or stopped
// without saying why.
func TestParseBootFailureCloudInit(t *testing.T) {
	t.Parallel()
	const end = "Cloud-init v. 22.4.2 finished at Wed, 25 Nov 2026 21:00:00 +0000. Datasource DataSourceNoCloud.  Up 4.20 seconds\n"
	if f := stackbuild.ParseBootFailure("Cloud-init v. 22.4.2 running 'modules:final'\n"); f != nil {
		t.Errorf("cloud-init still running read as failed: %v", f)
	}
	f := stackbuild.ParseBootFailure("Cloud-init v. 22.4.2 running 'modules:final'\n2026-11-25 WARNING: bad runcmd\n" + end)
	if f == nil || f.Step != stackbuild.StepBoot || !strings.Contains(f.Detail, "without running kloud's provisioning") {
		t.Errorf("no provisioning: %+v", f)
	}
	f = stackbuild.ParseBootFailure("KLOUD-PROVISION step=download status=start detail=\"u\"\nKLOUD-PROVISION step=download status=ok\nKLOUD-PROVISION step=start-klient status=start\n" + end)
	if f == nil || f.Step != stackbuild.StepAgentStart || f.Marker != userdata.StepStartKlient {
		t.Errorf("stopped mid-step: %+v", f)
	}
	if f := stackbuild.ParseBootFailure("KLOUD-PROVISION step=done status=ok\n" + end); f != nil {
		t.Errorf("done: %v", f)
	}
}

// neverAgents is kontrol with an agent that never registers.
type neverAgents struct{}

func (neverAgents) WaitRegistered(ctx context.Context, kiteID string) (stackbuild.Agent, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestPlannerFailsFromConsole: the planner fails a machine whose klient download is refused
// within seconds, naming the step and the console's tail, long before its agent timeout.
func TestPlannerFailsFromConsole(t *testing.T) {
	t.Parallel()
	m := boot(t, userdata.Config{KlientURL: refusingURL(t), KlientSHA256: strings.Repeat("a", 64)})
	pl := &stackbuild.Planner{Agents: neverAgents{}, Timeout: 2 * time.Minute, Log: testutil.Logger(t)}
	start := time.Now()
	r := pl.Wait(t.Context(), []stackbuild.Expect{{Label: "web", KiteID: "k1", Machine: m, Fresh: true}}, nil)[0]
	took := time.Since(start)
	t.Logf("after %s: %v", took, r.Err)
	if took > 10*time.Second {
		t.Errorf("the planner took %s", took)
	}
	var bf *stackbuild.BootFailure
	if r.OK || r.Step != stackbuild.StepDownload || !errors.As(r.Err, &bf) || !strings.HasPrefix(r.Err.Error(), "web: agent download failed") ||
		!strings.Contains(r.LogTail, "download attempt") || !strings.Contains(r.Err.Error(), "KLOUD-PROVISION step=download status=start") {
		t.Fatalf("result: %+v", r)
	}
}

// TestPlannerOldConsoleFailure: a machine that is not fresh (a start) is not failed for the user
// script failure its console shows of an earlier boot, a fresh one is; a failure before the agent
// started counts either way; a machine without ConsoleLog, or whose provider lacks the consoleLog
// capability, is waited for as before.
func TestPlannerOldConsoleFailure(t *testing.T) {
	t.Parallel()
	url, sum := klientServer(t)
	script := boot(t, userdata.Config{KlientURL: url, KlientSHA256: sum, UserData: "#!/bin/bash\nexit 3\n"})
	script.waitFailure(20 * time.Second)
	checksum := boot(t, userdata.Config{KlientURL: url, KlientSHA256: strings.Repeat("0", 64)})
	checksum.waitFailure(20 * time.Second)
	pl := &stackbuild.Planner{Agents: neverAgents{}, Timeout: 3 * time.Second, Log: testutil.Logger(t)}
	for _, tc := range []struct {
		e        stackbuild.Expect
		failStep string // "" = waits for the timeout
	}{
		{stackbuild.Expect{Label: "started", KiteID: "k1", Machine: script}, ""},
		{stackbuild.Expect{Label: "built", KiteID: "k2", Machine: script, Fresh: true}, stackbuild.StepUserScript},
		{stackbuild.Expect{Label: "checksum", KiteID: "k3", Machine: checksum}, stackbuild.StepDownload},
		{stackbuild.Expect{Label: "no-console", KiteID: "k4", Machine: noConsole{}}, ""},
		// A machine with ConsoleLog whose provider does not advertise consoleLog (a plugin's
		// proxy machine has the method either way) is not read; one whose provider does, is.
		{stackbuild.Expect{Label: "not-advertised", KiteID: "k5", Machine: checksum, Provider: &provider.Provider{Name: "p",
			Capabilities: []provider.Capability{provider.CapStart, provider.CapStop, provider.CapInfo}}}, ""},
		{stackbuild.Expect{Label: "advertised", KiteID: "k6", Machine: checksum, Provider: &provider.Provider{Name: "p",
			Capabilities: []provider.Capability{provider.CapConsoleLog}}}, stackbuild.StepDownload},
	} {
		start := time.Now()
		r := pl.Wait(t.Context(), []stackbuild.Expect{tc.e}, nil)[0]
		took := time.Since(start)
		switch {
		case tc.failStep == "" && (took < 3*time.Second || r.OK || !strings.Contains(r.Err.Error(), "did not register within 3s") ||
			tc.e.Provider != nil && (r.Step != stackbuild.StepRegistration || r.LogTail != "")):
			t.Errorf("%s: after %s: %+v", tc.e.Label, took, r)
		case tc.failStep != "" && (took > 2*time.Second || r.OK || r.Step != tc.failStep || !strings.Contains(r.Err.Error(), "failed inside the machine")):
			t.Errorf("%s: after %s: %+v", tc.e.Label, took, r)
		}
	}
}

type noConsole struct{}

func (noConsole) Start(context.Context) (any, error) { return nil, nil }
func (noConsole) Stop(context.Context) (any, error)  { return nil, nil }
func (noConsole) Info(context.Context) (provider.State, any, error) {
	return provider.Running, nil, nil
}
