package supervise

import (
	"context"
	"errors"
	"flag"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
)

// TestSupervisedHelper is not a test: run as `<test binary> -test.run=^TestSupervisedHelper$ --
// kloud-helper MODE ADDR` it is the process the supervisor tests supervise. MODE "serve"
// answers /healthz on ADDR until killed; "exit" exits at once with status 3.
func TestSupervisedHelper(t *testing.T) {
	args := flag.Args()
	if len(args) != 3 || args[0] != "kloud-helper" {
		t.Skip("helper process for the supervisor tests")
	}
	if args[1] == "exit" {
		os.Exit(3)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) })
	ln, err := net.Listen("tcp", args[2])
	if err != nil {
		os.Exit(4)
	}
	http.Serve(ln, mux)
	os.Exit(5)
}

func alive(pid int) bool { return pid > 0 && syscall.Kill(pid, 0) == nil }

// TestSupervisorRestarts: a supervised process that is SIGKILLed is started again after a
// backoff that grows, each exit logged with its cause; meanwhile OnDown said why it is down,
// OnUp that it is back. Stop stops it for good.
func TestSupervisorRestarts(t *testing.T) {
	t.Parallel()
	addr := testutil.FreeLoopback(t)
	var logs testutil.SyncBuffer
	var mu sync.Mutex
	var downs []string
	ups := 0
	s := &Process{
		Name: "terraformer", Bin: os.Args[0], Args: []string{"-test.run=^TestSupervisedHelper$", "--", "kloud-helper", "serve", addr},
		URL: "http://" + addr, Log: slog.New(slog.NewTextHandler(&logs, nil)),
		OnDown: func(err error) { mu.Lock(); downs = append(downs, err.Error()); mu.Unlock() },
		OnUp:   func() { mu.Lock(); ups++; mu.Unlock() },
	}
	if err := s.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	pid := s.PID()
	if !alive(pid) || !Healthz(t.Context(), nil, s.URL) {
		t.Fatalf("not running after Start: pid %d", pid)
	}
	for round := 1; round <= 3; round++ {
		old := pid
		syscall.Kill(old, syscall.SIGKILL)
		start := time.Now()
		testutil.Eventually(t, 10*time.Second, func() bool {
			pid = s.PID()
			return pid != 0 && pid != old && s.Restarts() == round && Healthz(t.Context(), nil, s.URL)
		}, "round %d: not restarted; log:\n%s", round, &logs)
		t.Logf("round %d: back after %s", round, time.Since(start))
	}
	mu.Lock()
	t.Logf("downs: %q", downs)
	if ups != 3 || len(downs) != 6 {
		t.Errorf("%d ups and %d downs, want 3 and 6 (restarting in…, starting a new one)", ups, len(downs))
	}
	// The backoff doubles: 100ms, 200ms, 400ms (+ up to 10% jitter).
	for i, want := range []string{"restarting it in 1", "restarting it in 2", "restarting it in 4"} {
		if d := downs[2*i]; !strings.Contains(d, "exited (signal: killed)") || !strings.Contains(d, want) {
			t.Errorf("down %d: %q, want the cause and %q", i, d, want)
		}
	}
	mu.Unlock()
	if l := logs.String(); strings.Count(l, `msg="terraformer exited"`) != 3 || strings.Count(l, `msg="restarting terraformer"`) != 3 || !strings.Contains(l, `cause="signal: killed"`) ||
		strings.Count(l, "terraformer restarted") != 3 {
		t.Errorf("log:\n%s", l)
	}
	s.Stop()
	if alive(pid) {
		t.Errorf("process %d still running after Stop", pid)
	}
	time.Sleep(300 * time.Millisecond)
	if s.Restarts() != 3 || Healthz(t.Context(), nil, s.URL) {
		t.Errorf("restarted after Stop")
	}
}

// TestSupervisorFirstStartFails: a process that cannot start is an error of Start, at once.
func TestSupervisorFirstStartFails(t *testing.T) {
	t.Parallel()
	addr := testutil.FreeLoopback(t)
	s := &Process{Name: "terraformer", Bin: os.Args[0], Args: []string{"-test.run=^TestSupervisedHelper$", "--", "kloud-helper", "exit", addr}, URL: "http://" + addr}
	err := s.Start(t.Context())
	if err == nil || !strings.Contains(err.Error(), "exited at start (exit status 3)") {
		t.Fatalf("Start: %v", err)
	}
	s.Stop() // returns at once: nothing runs
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	if Healthz(ctx, nil, s.URL) {
		t.Fatal("something answers")
	}
	if err := (&Process{Name: "terraformer", Bin: "/nonexistent/terraformer", URL: "http://" + addr}).Start(t.Context()); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Start of a missing binary: %v", err)
	}
}

// TestSupervisorHealthFunc: a Health func, not GET /healthz, says when the process answers;
// Start waits for it, and a start it never approves fails after StartTimeout, killing the
// process.
func TestSupervisorHealthFunc(t *testing.T) {
	t.Parallel()
	addr := testutil.FreeLoopback(t)
	var mu sync.Mutex
	calls := 0
	s := &Process{
		Name: "helper", Bin: os.Args[0], Args: []string{"-test.run=^TestSupervisedHelper$", "--", "kloud-helper", "serve", addr},
		URL: "http://" + addr,
		Health: func(ctx context.Context) bool {
			mu.Lock()
			defer mu.Unlock()
			calls++
			return calls > 3 && Healthz(ctx, nil, "http://"+addr)
		},
	}
	if err := s.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	n := calls
	mu.Unlock()
	s.Stop()
	if n < 4 {
		t.Fatalf("Start returned after %d health checks, want 4 or more", n)
	}

	never := &Process{
		Name: "helper", Bin: os.Args[0], Args: []string{"-test.run=^TestSupervisedHelper$", "--", "kloud-helper", "serve", addr},
		URL: "http://" + addr, StartTimeout: 500 * time.Millisecond, StopGrace: time.Second,
		Health: func(context.Context) bool { return false },
	}
	err := never.Start(t.Context())
	if err == nil || !strings.Contains(err.Error(), "helper (pid ") || !strings.Contains(err.Error(), "did not answer on http://"+addr+" within 500ms") {
		t.Fatalf("Start: %v", err)
	}
	never.Stop()
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	if Healthz(ctx, nil, "http://"+addr) {
		t.Fatal("the process that never became healthy still runs")
	}
}

// TestSupervisorBackoffResetsAfterService: a process killed now and then, having served
// DefaultResetAfter in between, is restarted after MinBackoff again, not after a backoff that
// kept growing across kills (issue 23: 6.7s by the seventh kill of a terraformer killed about a
// minute apart). Kills in quick succession still back off.
func TestSupervisorBackoffResetsAfterService(t *testing.T) {
	t.Parallel()
	addr := testutil.FreeLoopback(t)
	var mu sync.Mutex
	var downs []string
	s := &Process{
		Name: "terraformer", Bin: os.Args[0], Args: []string{"-test.run=^TestSupervisedHelper$", "--", "kloud-helper", "serve", addr},
		URL:    "http://" + addr,
		OnDown: func(err error) { mu.Lock(); downs = append(downs, err.Error()); mu.Unlock() },
	}
	if err := s.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	kill := func(round int) {
		t.Helper()
		old := s.PID()
		syscall.Kill(old, syscall.SIGKILL)
		testutil.Eventually(t, 20*time.Second, func() bool {
			pid := s.PID()
			return pid != 0 && pid != old && s.Restarts() == round && Healthz(t.Context(), nil, s.URL)
		}, "round %d: not restarted", round)
	}
	for round := 1; round <= 3; round++ {
		kill(round) // 100ms, 200ms, 400ms
	}
	time.Sleep(DefaultResetAfter + 500*time.Millisecond) // it serves
	kill(4)
	mu.Lock()
	defer mu.Unlock()
	t.Logf("downs: %q", downs)
	if len(downs) != 8 {
		t.Fatalf("%d downs, want 8", len(downs))
	}
	if d := downs[4]; !strings.Contains(d, "restarting it in 4") {
		t.Errorf("third quick kill: %q, want a grown backoff (400ms)", d)
	}
	if d := downs[6]; !strings.Contains(d, "restarting it in 1") || strings.Contains(d, "restarting it in 1.") {
		t.Errorf("kill after %s of service: %q, want the backoff reset (1xx ms)", DefaultResetAfter, d)
	}
}
