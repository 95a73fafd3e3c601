package kloud_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/dummy"
)

// Snapshots end to end through kloud with the dummy provider (real terraform, real klient
// processes): a snapshot of a running machine stops it, saves its disk and starts it again with
// its agent; restore brings the disk back, into the same machine or another; the owner alone
// sees them; the quota holds; they outlive the stack and are deleted with the provider's data.
func TestSnapshots(t *testing.T) {
	t.Parallel()
	f := newFlowWith(t, dummy.Options{}, kloudtest.Options{SnapshotQuota: kloud.SnapshotQuota{Count: 2}})
	f.credential()
	sid, _ := f.stack(f.template(twoVMs))
	if last := f.follow(f.apply(sid, false)); last.Status != api.JobSucceeded {
		t.Fatalf("build: %+v", last)
	}
	ms := f.machines(sid)
	vm0, vm1 := ms["vm.0"], ms["vm.1"]
	file := func(m model.Machine) string { return filepath.Join(f.dir, sid, m.Label, "note.txt") }
	write := func(m model.Machine, s string) {
		if err := os.WriteFile(file(m), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	read := func(m model.Machine) string {
		b, err := os.ReadFile(file(m))
		if errors.Is(err, os.ErrNotExist) {
			return "<none>"
		}
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	c := f.client()
	ctx := t.Context()
	write(vm0, "before")

	// Invalid params and unknown ids.
	if _, err := c.MachineSnapshot(ctx, api.SnapshotParams{MachineID: vm0.ID, Name: "bad\x00name"}); !errors.Is(err, kite.ErrInvalidParams) {
		t.Errorf("snapshot with a control character in its name: %v", err)
	}
	if _, err := c.MachineRestore(ctx, api.RestoreParams{SnapshotID: "nope"}); !errors.Is(err, kite.ErrNotFound) {
		t.Errorf("restore of an unknown snapshot: %v", err)
	}

	// A running machine: stopped, saved, started again with its agent.
	started, err := c.MachineSnapshot(ctx, api.SnapshotParams{MachineID: vm0.ID, Name: "first"})
	if err != nil {
		t.Fatal(err)
	}
	if last := f.follow(started.JobID); last.Status != api.JobSucceeded {
		t.Fatalf("snapshot: %+v", last)
	}
	if m := f.machines(sid)["vm.0"]; m.State != provider.Running || m.Agent.Status != model.AgentConnected {
		t.Fatalf("vm.0 after its snapshot: %s, agent %s (%s)", m.State, m.Agent.Status, m.Reason)
	}
	list, err := c.MachineSnapshots(ctx, api.SnapshotsParams{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Snapshots) != 1 || list.Snapshots[0].ID != started.SnapshotID || list.Snapshots[0].Status != model.SnapshotReady ||
		list.Snapshots[0].Name != "first" || list.Snapshots[0].Size != int64(len("before")) || list.Snapshots[0].MachineLabel != "vm.0" ||
		list.Used.Count != 1 || list.Quota.Count != 2 || list.Quota.Bytes != kloud.DefaultSnapshotBytes {
		t.Fatalf("machine.snapshots: %+v", list)
	}

	// Another user sees none of it.
	if _, err := f.Client(kloud.Admin).UserAdd(ctx, api.UserAddParams{Username: "bob", Team: model.DefaultTeam}); err != nil {
		t.Fatal(err)
	}
	bob := f.Client("bob")
	if l, err := bob.MachineSnapshots(ctx, api.SnapshotsParams{}); err != nil || len(l.Snapshots) != 0 {
		t.Errorf("bob's snapshots: %+v %v", l, err)
	}
	if _, err := bob.MachineRestore(ctx, api.RestoreParams{SnapshotID: started.SnapshotID}); !errors.Is(err, kite.ErrNotFound) {
		t.Errorf("bob restores alice's snapshot: %v", err)
	}
	if _, err := bob.SnapshotDelete(ctx, api.SnapshotRef{SnapshotID: started.SnapshotID}); !errors.Is(err, kite.ErrNotFound) {
		t.Errorf("bob deletes alice's snapshot: %v", err)
	}
	if _, err := bob.MachineSnapshot(ctx, api.SnapshotParams{MachineID: vm0.ID}); !errors.Is(err, kite.ErrNotFound) {
		t.Errorf("bob snapshots alice's machine: %v", err)
	}

	// Restore into the same machine: the disk is what it was.
	write(vm0, "after")
	ref, err := c.MachineRestore(ctx, api.RestoreParams{SnapshotID: started.SnapshotID})
	if err != nil {
		t.Fatal(err)
	}
	if last := f.follow(ref.JobID); last.Status != api.JobSucceeded {
		t.Fatalf("restore: %+v", last)
	}
	if got := read(vm0); got != "before" {
		t.Errorf("vm.0 after restore: %q, want %q", got, "before")
	}
	if m := f.machines(sid)["vm.0"]; m.State != provider.Running || m.Agent.Status != model.AgentConnected {
		t.Fatalf("vm.0 after restore: %s, agent %s (%s)", m.State, m.Agent.Status, m.Reason)
	}

	// Into another, stopped, machine: it stays stopped. A snapshot of it counts (2 of 2).
	if ref, err = c.MachineStop(ctx, api.MachineRef{MachineID: vm1.ID}); err != nil {
		t.Fatal(err)
	}
	if last := f.follow(ref.JobID); last.Status != api.JobSucceeded {
		t.Fatalf("stop: %+v", last)
	}
	if ref, err = c.MachineRestore(ctx, api.RestoreParams{SnapshotID: started.SnapshotID, MachineID: vm1.ID}); err != nil {
		t.Fatal(err)
	}
	if last := f.follow(ref.JobID); last.Status != api.JobSucceeded {
		t.Fatalf("restore into vm.1: %+v", last)
	}
	if got, m := read(vm1), f.machines(sid)["vm.1"]; got != "before" || m.State != provider.Stopped {
		t.Errorf("vm.1 after restore: %q, %s", got, m.State)
	}
	second, err := c.MachineSnapshot(ctx, api.SnapshotParams{MachineID: vm1.ID})
	if err != nil {
		t.Fatal(err)
	}
	if last := f.follow(second.JobID); last.Status != api.JobSucceeded {
		t.Fatalf("snapshot of a stopped machine: %+v", last)
	}
	if m := f.machines(sid)["vm.1"]; m.State != provider.Stopped {
		t.Errorf("vm.1 after its snapshot: %s", m.State)
	}
	_, err = c.MachineSnapshot(ctx, api.SnapshotParams{MachineID: vm0.ID})
	var ke *kite.Error
	if !errors.As(err, &ke) || ke.Code != kite.CodeTooLarge || !strings.Contains(err.Error(), "quota 2") {
		t.Errorf("a third snapshot with a quota of 2: %v", err)
	}

	// The stack goes; the snapshots stay, restorable elsewhere only, and are deleted with their data.
	if last := f.follow(f.apply(sid, true)); last.Status != api.JobSucceeded {
		t.Fatalf("destroy: %+v", last)
	}
	if l, err := c.MachineSnapshots(ctx, api.SnapshotsParams{}); err != nil || len(l.Snapshots) != 2 {
		t.Fatalf("snapshots after the stack was destroyed: %+v %v", l, err)
	}
	if _, err := c.MachineRestore(ctx, api.RestoreParams{SnapshotID: started.SnapshotID}); !errors.Is(err, kite.ErrNotFound) || !strings.Contains(err.Error(), "another dummy machine") {
		t.Errorf("restore into the destroyed machine: %v", err)
	}
	for _, id := range []string{started.SnapshotID, second.SnapshotID} {
		if _, err := c.SnapshotDelete(ctx, api.SnapshotRef{SnapshotID: id}); err != nil {
			t.Fatalf("delete snapshot %s: %v", id, err)
		}
		if _, err := os.Stat(filepath.Join(f.dir, ".snapshots", id)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("snapshot %s's data after delete: %v", id, err)
		}
	}
	testutil.Eventually(t, 5*time.Second, func() bool {
		l, err := c.MachineSnapshots(ctx, api.SnapshotsParams{})
		return err == nil && len(l.Snapshots) == 0 && l.Used.Count == 0
	}, "snapshots left after delete")
}

// ParseSnapshotQuota reads kloud serve's --snapshot-quota.
func TestParseSnapshotQuota(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]kloud.SnapshotQuota{
		"10": {Count: 10}, "5,1G": {Count: 5, Bytes: 1 << 30}, "3, 512MiB": {Count: 3, Bytes: 512 << 20},
		"unlimited,unlimited": {Count: -1, Bytes: -1}, "7,1000": {Count: 7, Bytes: 1000},
	} {
		got, err := kloud.ParseSnapshotQuota(in)
		if err != nil || got != want {
			t.Errorf("%q: %+v %v, want %+v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0", "-1", "x,1G", "3,1Q", "3,-5"} {
		if _, err := kloud.ParseSnapshotQuota(in); err == nil {
			t.Errorf("%q: no error", in)
		}
	}
}

// A snapshot that fails leaves a running machine running (started again, agent back), the
// snapshot failed with the provider's reason and no data, counted until deleted.
func TestSnapshotFailureRestartsMachine(t *testing.T) {
	t.Parallel()
	f := newFlow(t, dummy.Options{Fail: map[string]error{"Snapshot": errors.New("the disk is full")}})
	f.credential()
	sid, _ := f.stack(f.template(`
resource "terraform_data" "vm" {
  input = "#!/bin/bash\necho hi"
}
`))
	if last := f.follow(f.apply(sid, false)); last.Status != api.JobSucceeded {
		t.Fatalf("build: %+v", last)
	}
	vm := f.machines(sid)["vm"]
	c := f.client()
	started, err := c.MachineSnapshot(t.Context(), api.SnapshotParams{MachineID: vm.ID})
	if err != nil {
		t.Fatal(err)
	}
	last := f.follow(started.JobID)
	if last.Status != api.JobFailed || !strings.Contains(last.Error, "the disk is full") || !strings.Contains(last.Error, "running again") {
		t.Fatalf("failed snapshot: %+v", last)
	}
	if m := f.machines(sid)["vm"]; m.State != provider.Running || m.Agent.Status != model.AgentConnected {
		t.Fatalf("vm after a failed snapshot: %s, agent %s (%s)", m.State, m.Agent.Status, m.Reason)
	}
	l, err := c.MachineSnapshots(t.Context(), api.SnapshotsParams{})
	if err != nil || len(l.Snapshots) != 1 || l.Snapshots[0].Status != model.SnapshotFailed || !strings.Contains(l.Snapshots[0].Error, "the disk is full") {
		t.Fatalf("snapshots after the failure: %+v %v", l, err)
	}
	if _, err := c.MachineRestore(t.Context(), api.RestoreParams{SnapshotID: started.SnapshotID}); !errors.Is(err, kite.ErrState) {
		t.Errorf("restore of a failed snapshot: %v", err)
	}
	if _, err := c.SnapshotDelete(t.Context(), api.SnapshotRef{SnapshotID: started.SnapshotID}); err != nil {
		t.Fatal(err)
	}
}
