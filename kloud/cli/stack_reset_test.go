package cli_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/provider"
)

// TestStackResetCommand: `kloud stack reset` as the administrator moves a stuck stack to Failed
// and `stack describe` shows the audit record; a member (the stack's owner) is refused, and so
// is a reset without --reason.
func TestStackResetCommand(t *testing.T) {
	t.Parallel()
	e, run, must := startKloud(t, kloudtest.Options{})
	aliceKey := filepath.Join(t.TempDir(), "alice.key")
	must(run("user", "add", "alice", "--team", model.DefaultTeam))
	must(run("key", "create", "--username", "alice", "--out", aliceKey))

	// A stack an older kloud left Building, with no job.
	now := e.Server.Store().Now()
	m := model.Machine{ID: store.NewID(), Label: "vm", Resource: "vm", Provider: "dummy", Owner: "alice", Team: model.DefaultTeam,
		State: provider.Building, CreatedAt: now, UpdatedAt: now}
	st := model.Stack{ID: store.NewID(), Title: "stuck", Team: model.DefaultTeam, Owner: "alice", State: model.StackBuilding,
		Machines: []string{m.ID}, CreatedAt: now, UpdatedAt: now}
	m.StackID = st.ID
	if err := e.Server.Store().Machines().InsertMany(t.Context(), []model.Machine{m}); err != nil {
		t.Fatal(err)
	}
	if err := e.Server.Store().Stacks().Insert(t.Context(), st); err != nil {
		t.Fatal(err)
	}

	if code, _, stderr := run("stack", "reset", st.ID, "--reason", "mine", "--key", aliceKey); code == 0 || !strings.Contains(stderr, "administrators") {
		t.Fatalf("member's reset: exit %d: %s", code, stderr)
	}
	if code, _, stderr := run("stack", "reset", st.ID); code == 0 || !strings.Contains(stderr, "reason") {
		t.Fatalf("reset without a reason: exit %d: %s", code, stderr)
	}
	out := must(run("stack", "reset", st.ID, "--reason", "INC-7 stuck since the upgrade"))
	if !strings.Contains(out, "is Failed") || !strings.Contains(out, "by admin") || !strings.Contains(out, "Unknown") {
		t.Fatalf("reset:\n%s", out)
	}
	out = must(run("stack", "describe", st.ID, "--key", aliceKey))
	if !strings.Contains(out, "reset: ") || !strings.Contains(out, "to Failed: INC-7 stuck since the upgrade") || !strings.Contains(out, "by admin from") {
		t.Fatalf("describe after reset:\n%s", out)
	}
}
