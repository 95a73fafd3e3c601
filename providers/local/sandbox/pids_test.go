package sandbox_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/providers/local/sandbox"
)

// TestForkBombStaysUnderPidsLimit: a fork bomb in a machine (through Exec, which joins the
// machine's cgroups) is refused forks beyond the machine's pids limit, the host keeps forking and
// answering meanwhile, and the machine is then destroyed with nothing left.
func TestForkBombStaysUnderPidsLimit(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	if err := e.m.SetupNetwork(ctx); err != nil {
		t.Fatal(err)
	}
	const limit = 64
	info := e.create(t, sandbox.Spec{ID: "bomb-1", Hostname: "kd-bomb-1", PidsMax: limit})
	pidsCg, max := cgroupFile(t, info.PID, "pids", "pids.max", "pids.max")
	if max != strconv.Itoa(limit) {
		t.Fatalf("pids.max of %s = %s, want %d", pidsCg, max, limit)
	}
	// Background sleeps until forks fail: 500 would be far over the limit.
	bctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	type result struct {
		out []byte
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := e.m.Exec(bctx, info.ID, "bash", "-c",
			`n=0; for i in $(seq 500); do sleep 300 2>/dev/null & n=$((n+1)); done 2>&1; echo started $n`)
		done <- result{out, err}
	}()
	peak := 0
	deadline := time.After(60 * time.Second)
	refused := false
	for !refused {
		select {
		case <-deadline:
			t.Fatalf("no fork was refused (pids.events: %s)", readTrim(filepath.Join(pidsCg, "pids.events")))
		case <-time.After(100 * time.Millisecond):
		}
		if n, _ := strconv.Atoi(readTrim(filepath.Join(pidsCg, "pids.current"))); n > peak {
			peak = n
		}
		ev := readTrim(filepath.Join(pidsCg, "pids.events"))
		refused = strings.HasPrefix(ev, "max ") && ev != "max 0"
		// The host keeps answering: this process forks, the manager answers.
		if err := exec.CommandContext(ctx, "true").Run(); err != nil {
			t.Fatalf("the host cannot fork during the bomb: %v", err)
		}
		if got, err := e.m.Info(ctx, info.ID); err != nil || got.State != sandbox.StateRunning {
			t.Fatalf("info during the bomb: %+v %v", got, err)
		}
	}
	if peak > limit {
		t.Errorf("pids.current peaked at %d, over the limit %d", peak, limit)
	}
	t.Logf("forks refused (pids.events %s), peak %d of %d", readTrim(filepath.Join(pidsCg, "pids.events")), peak, limit)

	if err := e.m.Destroy(ctx, info.ID); err != nil {
		t.Fatalf("destroy during the bomb: %v", err)
	}
	select {
	case r := <-done:
		t.Logf("bomb ended: %v %s", r.err, r.out)
	case <-time.After(30 * time.Second):
		t.Error("the bomb's exec did not end after destroy")
	}
	e.assertGone(t, info, pidsCg)
}

func readTrim(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	return strings.TrimSpace(string(b))
}
