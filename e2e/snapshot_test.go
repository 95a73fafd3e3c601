package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLocalSnapshot: the README's snapshot walk-through on a real local machine through the CLI:
// snapshot (of the running machine: stopped, saved, started again with its agent) → write a
// file → restore → the file is gone and the one saved is back; the agent reconnects as itself;
// the snapshot is listed with its size and deleted with its data.
func TestLocalSnapshot(t *testing.T) {
	e := newLocalEnv(t)
	e.alice()
	sid := e.createStack(e.template(localTemplate("snap", 1, "#!/bin/bash\necho hi > /root/user-script-ran")))
	e.run("stack", "apply", sid)
	m := e.machines(sid)["snap.0"]
	if m.State != "Running" || m.Agent.Status != "connected" {
		t.Fatalf("snap.0 after apply: %+v", m)
	}
	id := m.sandboxID()
	word := randomWord()
	e.exec(id, "sh", "-c", "echo "+word+" > /root/saved && sync")

	// Its last line is the snapshot's id.
	out := strings.Fields(e.run("machine", "snapshot", "snap.0", "--name", "before the change"))
	var started struct{ SnapshotID string }
	if len(out) > 0 {
		started.SnapshotID = out[len(out)-1]
	}
	if m := e.machines(sid)["snap.0"]; m.State != "Running" || m.Agent.Status != "connected" {
		t.Fatalf("snap.0 after its snapshot: %+v", m)
	}
	var list struct {
		Snapshots []struct {
			ID, Name, Status, MachineLabel string
			Size                           int64
		}
		Used struct{ Count int }
	}
	e.runJSON(&list, "machine", "snapshots")
	if len(list.Snapshots) != 1 || list.Snapshots[0].ID != started.SnapshotID || list.Snapshots[0].Status != "ready" ||
		list.Snapshots[0].Size <= 0 || list.Snapshots[0].Name != "before the change" || list.Used.Count != 1 {
		t.Fatalf("machine snapshots: %+v", list)
	}
	if out := e.run("machine", "snapshots", "snap.0"); !strings.Contains(out, "before the change") || !strings.Contains(out, "used 1 of 10 snapshots") {
		t.Errorf("machine snapshots table:\n%s", out)
	}

	e.exec(id, "sh", "-c", "echo changed > /root/saved && echo new > /root/later && sync")
	e.run("machine", "restore", started.SnapshotID)
	m2 := e.machines(sid)["snap.0"]
	if m2.State != "Running" || m2.Agent.Status != "connected" || m2.KiteID != m.KiteID {
		t.Fatalf("snap.0 after restore: %+v (kite before %s)", m2, m.KiteID)
	}
	if got := e.exec(id, "cat", "/root/saved"); got != word {
		t.Errorf("/root/saved after restore: %q, want %q", got, word)
	}
	if got := e.exec(id, "sh", "-c", "test -e /root/later && echo present || echo gone"); got != "gone" {
		t.Errorf("/root/later (written after the snapshot) after restore: %s", got)
	}
	if k, ok := e.kites()[m.KiteID]; !ok || k.Kite.Hostname != "snap-0" {
		t.Errorf("snap.0's kite after restore: %+v (registered %v)", k, ok)
	}

	file := filepath.Join(e.h.StateDir, ".snapshots", started.SnapshotID+".tar.zst")
	if _, err := os.Stat(file); err != nil {
		t.Fatalf("the snapshot's data: %v", err)
	}
	e.run("snapshot", "delete", started.SnapshotID)
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Errorf("the snapshot's data after delete: %v", err)
	}
	if out, err := e.try("machine", "restore", started.SnapshotID); err == nil || !strings.Contains(out, "not found") {
		t.Errorf("restore of a deleted snapshot: %v\n%s", err, out)
	}
	e.run("stack", "destroy", sid)
}
