package cli_test

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/dummy"
)

// TestSnapshotCommands: `kloud machine snapshots` and `kloud snapshot list` show the user's
// snapshots with the quota, `kloud snapshot delete` deletes one of a machine that is gone (the
// provider is asked through what the snapshot recorded), another user's is not found, and
// `kloud serve --snapshot-quota` refuses a bad value. (Taking and restoring snapshots is
// kloud's TestSnapshots and e2e's TestLocalSnapshot.)
func TestSnapshotCommands(t *testing.T) {
	t.Parallel()
	reg := provider.NewRegistry()
	reg.Register(dummy.New(dummy.Options{Dir: filepath.Join(t.TempDir(), "machines")}))
	e, run, must := startKloud(t, kloudtest.Options{Providers: reg, SnapshotQuota: kloud.SnapshotQuota{Count: 5, Bytes: 1 << 30}})
	aliceKey := filepath.Join(t.TempDir(), "alice.key")
	must(run("user", "add", "alice", "--team", model.DefaultTeam))
	must(run("key", "create", "--username", "alice", "--out", aliceKey))
	sn := model.Snapshot{ID: store.NewID(), Name: "before the upgrade", Owner: "alice", Team: model.DefaultTeam, MachineID: store.NewID(),
		MachineLabel: "vm.0", StackID: store.NewID(), Provider: "dummy", Status: model.SnapshotReady, Size: 3 << 20, Format: "files",
		Attributes: map[string]any{"id": "x"}}
	if err := e.Server.Store().Snapshots().Insert(t.Context(), sn); err != nil {
		t.Fatal(err)
	}

	out := must(run("snapshot", "list", "--key", aliceKey))
	if !strings.Contains(out, sn.ID) || !strings.Contains(out, "before the upgrade") || !strings.Contains(out, "3.0M") ||
		!strings.Contains(out, "used 1 of 5 snapshots, 3.0M of 1.0G") {
		t.Fatalf("snapshot list:\n%s", out)
	}
	var res api.SnapshotsResult
	if err := json.Unmarshal([]byte(must(run("snapshot", "list", "--key", aliceKey, "--json"))), &res); err != nil ||
		len(res.Snapshots) != 1 || res.Snapshots[0].Status != model.SnapshotReady || res.Quota.Count != 5 {
		t.Fatalf("snapshot list --json: %+v %v", res, err)
	}
	if out := must(run("snapshot", "list")); strings.Contains(out, sn.ID) {
		t.Errorf("the admin's own list shows alice's snapshot:\n%s", out)
	}
	if code, _, stderr := run("machine", "restore", sn.ID, "--key", aliceKey); code == 0 || !strings.Contains(stderr, "no longer exists") {
		t.Errorf("restore into the machine that is gone: exit %d: %s", code, stderr)
	}
	must(run("user", "add", "bob", "--team", model.DefaultTeam))
	bobKey := filepath.Join(t.TempDir(), "bob.key")
	must(run("key", "create", "--username", "bob", "--out", bobKey))
	if code, _, stderr := run("snapshot", "delete", sn.ID, "--key", bobKey); code == 0 || !strings.Contains(stderr, "not found") {
		t.Errorf("bob deletes alice's snapshot: exit %d: %s", code, stderr)
	}
	out = must(run("snapshot", "delete", sn.ID, "--key", aliceKey))
	if !strings.Contains(out, "deleted snapshot "+sn.ID) {
		t.Errorf("snapshot delete:\n%s", out)
	}
	if out := must(run("machine", "snapshots", "--key", aliceKey)); strings.Contains(out, sn.ID) || !strings.Contains(out, "used 0 of 5") {
		t.Errorf("after delete:\n%s", out)
	}
	if code, _, stderr := run("serve", "--snapshot-quota", "lots"); code == 0 || !strings.Contains(stderr, "snapshot quota") {
		t.Errorf("serve --snapshot-quota lots: exit %d: %s", code, stderr)
	}
}
