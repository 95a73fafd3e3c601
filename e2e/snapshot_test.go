package e2e

import (
	"path/filepath"
	"testing"
)

// TestLocalSnapshot: the README's snapshot walk-through on a real local machine through the CLI
// (snapshotRestoresFile): snapshot → write a file → restore → the file is gone.
func TestLocalSnapshot(t *testing.T) {
	parallel(t)
	e := newLocalEnv(t)
	e.alice()
	sid := e.createStack(e.template(localTemplate("snap", 1, "#!/bin/bash\necho hi > /root/user-script-ran")))
	e.run("stack", "apply", sid)
	id := e.machines(sid)["snap.0"].sandboxID()
	e.snapshotRestoresFile(sid, "snap.0", func(argv ...string) string { return e.exec(id, argv...) }, func(snapID string) string {
		return filepath.Join(e.h.StateDir, ".snapshots", snapID+".tar.zst")
	})
	e.run("stack", "destroy", sid)
}
