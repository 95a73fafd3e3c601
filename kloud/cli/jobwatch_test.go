package cli_test

import (
	"encoding/json"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/dummy"
)

// TestDetachAndFollow: a command that starts a job (here machine restore) says with --detach how
// to follow it and returns at once, with --json as a job reference; `kloud job watch` then
// follows that job to its end (it ends: the machine record has no stack behind it, so the
// restore fails, and the watch says so and exits non-zero).
func TestDetachAndFollow(t *testing.T) {
	t.Parallel()
	reg := provider.NewRegistry()
	reg.Register(dummy.New(dummy.Options{Dir: filepath.Join(t.TempDir(), "machines")}))
	e, run, must := startKloud(t, kloudtest.Options{Providers: reg})
	aliceKey := filepath.Join(t.TempDir(), "alice.key")
	alice := func(args ...string) (int, string, string) { return run(append(args, "--key", aliceKey)...) }
	must(run("user", "add", "alice", "--team", model.DefaultTeam))
	must(run("key", "create", "--username", "alice", "--out", aliceKey))

	now := e.Server.Store().Now()
	m := model.Machine{ID: store.NewID(), Label: "vm.0", Resource: "vm", Provider: "dummy", Owner: "alice", Team: model.DefaultTeam,
		State: provider.Stopped, CreatedAt: now, UpdatedAt: now, StackID: store.NewID()}
	m1 := m
	m1.ID, m1.Label = store.NewID(), "vm.1"
	if err := e.Server.Store().Machines().InsertMany(t.Context(), []model.Machine{m, m1}); err != nil {
		t.Fatal(err)
	}
	sn := model.Snapshot{ID: store.NewID(), Name: "s", Owner: "alice", Team: model.DefaultTeam, MachineID: m.ID, MachineLabel: m.Label,
		StackID: m.StackID, Provider: "dummy", Status: model.SnapshotReady, Size: 1, Format: "files"}
	if err := e.Server.Store().Snapshots().Insert(t.Context(), sn); err != nil {
		t.Fatal(err)
	}

	out := must(alice("machine", "restore", sn.ID, "--detach"))
	match := regexp.MustCompile(`^job (\S+) started; follow it with: kloud job watch (\S+)\n$`).FindStringSubmatch(out)
	if match == nil || match[1] != match[2] {
		t.Fatalf("restore --detach printed %q", out)
	}
	jobID := match[1]
	code, stdout, stderr := alice("job", "watch", jobID)
	if code == 0 || !strings.Contains(stderr, "job "+jobID+" failed") || strings.Contains(stderr, "stopped following") {
		t.Fatalf("job watch of the restore: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	if !strings.Contains(stdout, "%") {
		t.Errorf("job watch printed no progress:\n%s", stdout)
	}

	// The failed job left vm.0 in the state its provider reports (none: Unknown), so the
	// second restore goes into another machine.
	var ref api.JobRef
	code, out, stderr = alice("machine", "restore", sn.ID, "--into", "vm.1", "--detach", "--json")
	if code != 0 || json.Unmarshal([]byte(out), &ref) != nil {
		t.Fatalf("restore --detach --json: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, stderr)
	}
	if ref.JobID == "" || ref.JobID == jobID {
		t.Fatalf("restore --detach --json: job %q (the first was %s)", ref.JobID, jobID)
	}
	// With --json, job watch prints the job's events, one JSON object a line, the last one done.
	code, out, _ = alice("job", "watch", ref.JobID, "--json")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var last api.JobEvent
	if code == 0 || json.Unmarshal([]byte(lines[len(lines)-1]), &last) != nil || !last.Status.Done() {
		t.Fatalf("job watch --json of the second restore: exit %d\n%s", code, out)
	}
}
