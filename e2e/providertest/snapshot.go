package providertest

import (
	"crypto/rand"
	"encoding/hex"
	"testing"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/provider"
)

// Snapshot: a provider that advertises "snapshot" implements provider.Snapshotter; a snapshot
// of a running machine (machine.snapshot) leaves it running with its agent; a file written after
// it is gone after machine.restore (the disk is the snapshot's); restored into the other machine
// of the stack, the snapshot's file is there and that machine's own agent connects again (it
// kept its identity); snapshot.delete removes it. Without the capability, machine.snapshot is
// refused with -32005 and the subtest skips.
func (s *suite) testSnapshot(t *testing.T) {
	s.needStack(t)
	m, other := s.machines[0], s.machines[len(s.machines)-1]
	if !s.caps[provider.CapSnapshot] {
		_, err := s.cl.MachineSnapshot(t.Context(), api.SnapshotParams{MachineID: m.ID})
		wantCode(t, "machine.snapshot of a provider without snapshots", err, kite.ErrState)
		s.needCap(t, provider.CapSnapshot)
	}
	pm, err := s.p.Machine(s.base(t, m))
	if err != nil {
		t.Fatalf("provider machine of %s: %v", m.Label, err)
	}
	if _, ok := pm.(provider.Snapshotter); !ok && s.c.Plugin == "" {
		t.Fatalf("provider %s advertises %q, but its machine (%T) does not implement provider.Snapshotter", s.p.Name, provider.CapSnapshot, pm)
	}
	for _, x := range []Machine{m, other} {
		s.waitMachine(t, x.Label, provider.Running, model.AgentConnected, agentTimeout)
	}
	b := make([]byte, 8)
	rand.Read(b)
	const path = "kloud-conformance-snapshot.txt"
	saved := "in the snapshot " + hex.EncodeToString(b)
	s.c.WriteFile(t, m, path, saved)

	started, err := s.cl.MachineSnapshot(t.Context(), api.SnapshotParams{MachineID: m.ID, Name: "conformance"})
	if err != nil {
		t.Fatalf("machine.snapshot: %v", err)
	}
	s.job(t, "snapshot of a running machine", started.JobID)
	s.waitMachine(t, m.Label, provider.Running, model.AgentConnected, agentTimeout)
	list, err := s.cl.MachineSnapshots(t.Context(), api.SnapshotsParams{MachineID: m.ID})
	if err != nil {
		t.Fatalf("machine.snapshots: %v", err)
	}
	if len(list.Snapshots) != 1 || list.Snapshots[0].ID != started.SnapshotID || list.Snapshots[0].Status != model.SnapshotReady ||
		list.Snapshots[0].Size <= 0 || list.Snapshots[0].Provider != s.p.Name {
		t.Fatalf("machine.snapshots after the snapshot: %+v", list.Snapshots)
	}
	t.Logf("snapshot: %d bytes (%d of data, %s)", list.Snapshots[0].Size, list.Snapshots[0].DiskSize, list.Snapshots[0].Format)

	s.c.WriteFile(t, m, path, "written after the snapshot")
	ref, err := s.cl.MachineRestore(t.Context(), api.RestoreParams{SnapshotID: started.SnapshotID})
	if err != nil {
		t.Fatalf("machine.restore: %v", err)
	}
	s.job(t, "restore into the same machine", ref.JobID)
	s.waitMachine(t, m.Label, provider.Running, model.AgentConnected, agentTimeout)
	if got := s.c.ReadFile(t, m, path); got != saved {
		t.Errorf("after restore, %s holds %q, want the snapshot's %q", path, got, saved)
	}

	if other.ID != m.ID {
		ref, err = s.cl.MachineRestore(t.Context(), api.RestoreParams{SnapshotID: started.SnapshotID, MachineID: other.ID})
		if err != nil {
			t.Fatalf("machine.restore into %s: %v", other.Label, err)
		}
		s.job(t, "restore into another machine", ref.JobID)
		got := s.waitMachine(t, other.Label, provider.Running, model.AgentConnected, agentTimeout)
		if got.KiteID != other.KiteID {
			t.Errorf("%s's agent after the restore: kite %s, want its own %s", other.Label, got.KiteID, other.KiteID)
		}
		if got := s.c.ReadFile(t, other, path); got != saved {
			t.Errorf("restored into %s, %s holds %q, want the snapshot's %q", other.Label, path, got, saved)
		}
	}

	if _, err := s.cl.SnapshotDelete(t.Context(), api.SnapshotRef{SnapshotID: started.SnapshotID}); err != nil {
		t.Fatalf("snapshot.delete: %v", err)
	}
	if l, err := s.cl.MachineSnapshots(t.Context(), api.SnapshotsParams{}); err != nil || len(l.Snapshots) != 0 {
		t.Errorf("machine.snapshots after snapshot.delete: %+v %v", l.Snapshots, err)
	}
	_, err = s.cl.MachineRestore(t.Context(), api.RestoreParams{SnapshotID: started.SnapshotID})
	wantCode(t, "machine.restore of a deleted snapshot", err, kite.ErrNotFound)
}
