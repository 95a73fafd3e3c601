package kloud_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/dummy"
)

// TestSnapshotLeaseAndState: machine.snapshot and machine.restore refuse a machine that is
// neither Running nor Stopped (saying so) and one whose lease another job holds (busy); a
// refusal keeps no snapshot record and gives the machine's lease back at once.
func TestSnapshotLeaseAndState(t *testing.T) {
	t.Parallel()
	reg := provider.NewRegistry()
	reg.Register(dummy.New(dummy.Options{Dir: t.TempDir()}))
	e := kloudtest.Start(t, kloudtest.Options{Providers: reg})
	ctx := t.Context()
	st := e.Server.Store()
	if _, err := e.Client(kloud.Admin).UserAdd(ctx, api.UserAddParams{Username: "alice", Team: model.DefaultTeam}); err != nil {
		t.Fatal(err)
	}
	now := st.Now()
	building := model.Machine{ID: store.NewID(), Label: "vm.0", Resource: "vm", Provider: "dummy", Owner: "alice", Team: model.DefaultTeam,
		State: provider.Building, StackID: store.NewID(), CreatedAt: now, UpdatedAt: now}
	stopped := building
	stopped.ID, stopped.Label, stopped.State = store.NewID(), "vm.1", provider.Stopped
	if err := st.Machines().InsertMany(ctx, []model.Machine{building, stopped}); err != nil {
		t.Fatal(err)
	}
	sn := model.Snapshot{ID: store.NewID(), Name: "s", Owner: "alice", Team: model.DefaultTeam, MachineID: building.ID, MachineLabel: building.Label,
		StackID: building.StackID, Provider: "dummy", Status: model.SnapshotReady, Size: 1, Format: "files"}
	if err := st.Snapshots().Insert(ctx, sn); err != nil {
		t.Fatal(err)
	}
	alice := e.Client("alice")
	records := func() int {
		t.Helper()
		all, err := st.Snapshots().List(ctx, store.SnapshotFilter{Owner: "alice"})
		if err != nil {
			t.Fatal(err)
		}
		return len(all)
	}

	_, err := alice.MachineSnapshot(ctx, api.SnapshotParams{MachineID: building.ID})
	if !errors.Is(err, kite.ErrState) || !strings.Contains(err.Error(), "vm.0 is Building; a snapshot is taken of a Running or Stopped machine") {
		t.Errorf("snapshot of a Building machine: %v", err)
	}
	_, err = alice.MachineRestore(ctx, api.RestoreParams{SnapshotID: sn.ID})
	if !errors.Is(err, kite.ErrState) || !strings.Contains(err.Error(), "vm.0 is Building; a snapshot is restored into a Running or Stopped machine") {
		t.Errorf("restore into a Building machine: %v", err)
	}
	l, err := st.AcquireLease(ctx, "machine/"+building.ID, "test", time.Minute)
	if err != nil {
		t.Fatalf("the refusals kept vm.0's lease: %v", err)
	}
	l.Release(ctx)

	other, err := st.AcquireLease(ctx, "machine/"+stopped.ID, "another-job", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	_, err = alice.MachineSnapshot(ctx, api.SnapshotParams{MachineID: stopped.ID})
	if !errors.Is(err, kite.ErrConflict) || !strings.Contains(err.Error(), "vm.1 is busy") {
		t.Errorf("snapshot of a machine another job holds: %v", err)
	}
	_, err = alice.MachineRestore(ctx, api.RestoreParams{SnapshotID: sn.ID, MachineID: stopped.ID})
	if !errors.Is(err, kite.ErrConflict) || !strings.Contains(err.Error(), "vm.1 is busy") {
		t.Errorf("restore into a machine another job holds: %v", err)
	}
	if err := other.Release(ctx); err != nil {
		t.Errorf("the other job's lease after the refusals: %v", err)
	}
	if n := records(); n != 1 {
		t.Errorf("%d snapshot records after the refusals, want the 1 there was", n)
	}
}
