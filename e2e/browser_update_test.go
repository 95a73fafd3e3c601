package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// TestBrowserUpdateSnapshot drives the stack update and snapshot pages (issue 13 §1, §2) in
// Chromium (e2e/browser/update.mjs) on a real local machine, and checks each result through
// the API and inside the machine: alice's one-machine stack (built through the CLI) is
// snapshotted from the machine's page (listed ready with its size, the quota counting it), a
// file changed after it is back as saved once she restores it there, and the deleted snapshot
// is gone from the page, the quota and the API; after a new template revision the stack page
// (and the stacks list) says "Update available (rev 1 → 2)", its plan shows web.1 added and
// web.0 kept, and the confirmed update keeps web.0 (same machine, agent and disk) and adds
// web.1; the Scale card
// takes the resource back to 1 machine; bob, who has no share, is offered none of these
// controls on alice's pages. Needs root, the base image and Chromium (skips loudly
// otherwise, fails under CI=true). Screenshots in $KLOUD_ARTIFACTS/TestBrowserUpdateSnapshot.
func TestBrowserUpdateSnapshot(t *testing.T) {
	node, script, out := browserPrereqs(t)
	le := newLocalEnv(t)
	password := browserUsers(t, le.env)
	key := filepath.Join(le.dir, "alice.key")
	le.run("key", "create", "--username", "alice", "--out", key)
	le.key = key

	const userScript = "#!/bin/bash\necho ready"
	tid := le.template(localTemplate("web", 1, userScript))
	sid := le.createStack(tid)
	le.run("stack", "apply", sid)
	web0 := le.machines(sid)["web.0"]
	if web0.State != "Running" || web0.Agent.Status != "connected" {
		t.Fatalf("web.0 after apply: %+v", web0)
	}
	sandboxID := web0.sandboxID()
	word := randomWord()
	le.exec(sandboxID, "sh", "-c", "echo "+word+" > /root/saved && sync")

	type snapshots struct {
		Snapshots []struct{ ID, Name, Status string }
		Used      struct{ Count int }
	}
	// same checks that web.0 is the machine it was: record, agent and disk.
	same := func(m machine) error {
		if m.ID != web0.ID || m.KiteID != web0.KiteID || m.sandboxID() != sandboxID || m.State != "Running" || m.Agent.Status != "connected" {
			return fmt.Errorf("web.0 is not the machine it was: before %+v, now %+v", web0, m)
		}
		return nil
	}
	needs := map[string]func() error{
		"change-file": func() error {
			var list snapshots
			le.runJSON(&list, "machine", "snapshots")
			if len(list.Snapshots) != 1 || list.Snapshots[0].Status != "ready" || list.Snapshots[0].Name != "before the change" || list.Used.Count != 1 {
				return fmt.Errorf("machine snapshots after the page took one: %+v", list)
			}
			if err := same(le.machines(sid)["web.0"]); err != nil {
				return fmt.Errorf("after the snapshot: %w", err)
			}
			le.exec(sandboxID, "sh", "-c", "echo changed > /root/saved && echo new > /root/later && sync")
			return nil
		},
		"check-restored": func() error {
			if err := same(le.machines(sid)["web.0"]); err != nil {
				return fmt.Errorf("after the restore: %w", err)
			}
			if got := le.exec(sandboxID, "cat", "/root/saved"); got != word {
				return fmt.Errorf("/root/saved after the restore: %q, want %q", got, word)
			}
			if got := le.exec(sandboxID, "sh", "-c", "test -e /root/later && echo present || echo gone"); got != "gone" {
				return fmt.Errorf("/root/later (written after the snapshot) after the restore: %s", got)
			}
			return nil
		},
		"new-revision": func() error {
			f := filepath.Join(t.TempDir(), "main.tf")
			if err := os.WriteFile(f, []byte(localTemplate("web", 2, userScript)), 0o644); err != nil {
				return err
			}
			var list snapshots
			le.runJSON(&list, "machine", "snapshots")
			if len(list.Snapshots) != 0 || list.Used.Count != 0 {
				return fmt.Errorf("machine snapshots after the page deleted it: %+v", list)
			}
			le.run("template", "update", tid, "--file", f)
			return nil
		},
		"check-updated": func() error {
			var st struct {
				TemplateRev     int
				UpdateAvailable bool
			}
			le.runJSON(&st, "stack", "describe", sid)
			ms := le.machines(sid)
			if st.TemplateRev != 2 || st.UpdateAvailable || len(ms) != 2 {
				return fmt.Errorf("after the update: stack %+v, machines %+v", st, ms)
			}
			if web1 := ms["web.1"]; web1.State != "Running" || web1.Agent.Status != "connected" {
				return fmt.Errorf("web.1 after the update: %+v", web1)
			}
			if got := le.exec(sandboxID, "cat", "/root/saved"); got != word {
				return fmt.Errorf("web.0's /root/saved after the update: %q, want %q", got, word)
			}
			return same(ms["web.0"])
		},
		"check-scaled": func() error {
			ms := le.machines(sid)
			if len(ms) != 1 {
				return fmt.Errorf("after scaling to 1: %+v", ms)
			}
			if infos := le.sandboxInfos(); len(infos) != 1 || infos[0].ID != sandboxID {
				return fmt.Errorf("local machines after scaling to 1: %+v", infos)
			}
			return same(ms["web.0"])
		},
	}
	runBrowserScript(t, le.env, node, script, out, "update.mjs", needs, "KLOUD_PASSWORD="+password,
		"KLOUD_STACK="+sid, "KLOUD_MACHINE_ID="+web0.ID, "KLOUD_MACHINE=web.0",
		"KLOUD_RESOURCE=web", "KLOUD_ADDED=web.1", "KLOUD_OTHER_USER=bob")
	for _, f := range []string{"snapshot-taken.png", "update-plan.png", "scaled.png"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Fatalf("no screenshot: %v", err)
		}
	}
	le.run("stack", "destroy", sid)
	if infos := le.sandboxInfos(); len(infos) != 0 {
		t.Fatalf("local machines after destroy: %+v", infos)
	}
}
