package example_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/examples/provider-example/example"
	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/userdata"
)

const threeBlocks = `
resource "terraform_data" "db" {
  input = "#!/bin/bash\necho db"
}

resource "terraform_data" "vm" {
  count = 1
  input = "#!/bin/bash\necho vm"
}

resource "terraform_data" "web" {
  input = "#!/bin/bash\necho web"
}
`

const dbOnly = `
resource "terraform_data" "db" {
  input = "#!/bin/bash\necho db"
}
`

// TestRemoved: machines the example made are never left behind, in kloud's process and as a
// plugin. A stack update to a template without two machine resource blocks (one counted, one
// not) destroys their machines (processes and disks gone, records too) and keeps the other
// machine as it was (same agent process). The inventory lists each machine with kloud's tags
// and refuses to remove one by a forged listing (another stack, another machine tag, a path),
// ignores records that are links, too big or another instance's. Then the stack's record is
// deleted behind kloud's back: gc --dry-run names its machine and removes nothing, gc removes
// it (process, disk, record), and a second gc finds nothing. As a plugin, the plugin is killed
// before that: the one kloud starts again lists the same machine.
func TestRemoved(t *testing.T) {
	t.Parallel()
	t.Run("InProcess", func(t *testing.T) { testRemoved(t, false) })
	t.Run("Plugin", func(t *testing.T) { testRemoved(t, true) })
}

func testRemoved(t *testing.T, plugin bool) {
	e := newEnv(t, plugin)
	ctx := t.Context()
	admin := e.Client(kloud.Admin)
	cred, err := e.alice.CredentialAdd(ctx, api.CredentialAddParams{Provider: "example", Title: "mine", Data: []byte(`{"label":"gone","maxMachines":3}`)})
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.alice.CredentialBootstrap(ctx, api.CredentialBootstrapParams{CredentialID: cred.ID})
	e.succeed(api.JobRef{JobID: b.JobID}, err)
	tplID, sid := e.build("three", threeBlocks)
	ms := e.machines(sid)
	mdir := func(label string) string { return filepath.Join(e.dir, "machines", sid, label) }
	for _, l := range []string{"db", "vm.0", "web"} {
		if m := ms[l]; m.State != provider.Running || m.Agent.Status != model.AgentConnected || len(machineProcs(mdir(l))) == 0 {
			t.Fatalf("%s after build: %+v, processes %v", l, m, machineProcs(mdir(l)))
		}
	}
	dbPID := supervisorPID(t, mdir("db"))

	// The inventory: one resource per machine, tagged.
	p, err := e.Server.Providers().Lookup("example")
	if err != nil {
		t.Fatal(err)
	}
	inv := p.Inventory
	if inv == nil || !p.Can(provider.CapResources) {
		t.Fatalf("example: no inventory (capabilities %v)", p.Caps())
	}
	list := func() map[string]provider.Resource {
		t.Helper()
		rs, err := inv.Resources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]provider.Resource{}
		for _, r := range rs {
			out[r.Tag(provider.TagMachine)] = r
		}
		return out
	}
	rs := list()
	db := rs[ms["db"].ID]
	if len(rs) != 3 || db.Kind != example.KindMachine || db.Tag(provider.TagStack) != sid || db.Tag(provider.TagOwner) != "alice" || db.Tag(provider.TagTeam) != model.DefaultTeam || db.Incomplete || db.CreatedAt.IsZero() {
		t.Fatalf("resources: %+v", rs)
	}

	// Forged listings are refused and remove nothing; hostile records are not listed.
	for name, r := range map[string]provider.Resource{
		"another stack":   {ID: db.ID, Kind: db.Kind, Tags: map[string]string{provider.TagStack: "../" + sid, provider.TagMachine: ms["db"].ID}},
		"another machine": {ID: db.ID, Kind: db.Kind, Tags: map[string]string{provider.TagStack: sid, provider.TagMachine: ms["web"].ID}},
		"another kind":    {ID: db.ID, Kind: "container", Tags: db.Tags},
		"a path as id":    {ID: "../" + sid, Kind: db.Kind, Tags: db.Tags},
	} {
		if err := inv.RemoveResource(ctx, r); err == nil {
			t.Errorf("remove by a listing with %s: no error", name)
		}
	}
	if pid := supervisorPID(t, mdir("db")); pid != dbPID {
		t.Fatalf("db after forged removals: supervisor %d, was %d", pid, dbPID)
	}
	rec, err := os.ReadFile(mdir("db") + ".json")
	if err != nil {
		t.Fatal(err)
	}
	planted := filepath.Join(e.dir, "machines", "planted")
	if err := os.MkdirAll(filepath.Join(planted, "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(planted) })
	other := strings.Replace(string(rec), `"instance":"`, `"instance":"other-`, 1)
	for name, content := range map[string]string{"other.json": other, "big.json": string(rec) + strings.Repeat(" ", 70<<10)} {
		if err := os.WriteFile(filepath.Join(planted, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(mdir("db")+".json", filepath.Join(planted, "link.json")); err != nil {
		t.Fatal(err)
	}
	if got := list(); len(got) != 3 {
		t.Fatalf("resources with planted records (another instance's, a 70 KiB one, a link): %+v", got)
	}

	// An update that removes the vm and web blocks destroys their machines.
	if _, err := e.alice.TemplateUpdate(ctx, api.TemplateParams{TemplateID: tplID, Files: map[string]string{"main.tf": dbOnly}}); err != nil {
		t.Fatal(err)
	}
	e.succeed(e.alice.StackUpdate(ctx, api.StackUpdateParams{StackID: sid}))
	if got := e.machines(sid); len(got) != 1 || got["db"].State != provider.Running {
		t.Fatalf("machines after the update: %+v", got)
	}
	for _, l := range []string{"vm.0", "web"} {
		if procs := machineProcs(mdir(l)); len(procs) != 0 {
			t.Errorf("%s's processes after its block was removed: %v", l, procs)
		}
		for _, p := range []string{mdir(l), mdir(l) + ".json"} {
			if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s after its block was removed: %v", p, err)
			}
		}
	}
	if pid := supervisorPID(t, mdir("db")); pid != dbPID {
		t.Fatalf("db after the update: supervisor %d, was %d", pid, dbPID)
	}
	if got := list(); len(got) != 1 || got[ms["db"].ID].ID != db.ID {
		t.Fatalf("resources after the update: %+v", got)
	}

	if plugin {
		// The plugin is killed (its machines' processes die with it): the one kloud starts
		// again lists the same machine, under the same instance (kept in its state dir).
		pid := e.Server.PluginPID("example")
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, time.Minute, func() bool {
			// A new plugin first (0: the killed one is gone and none runs yet), then its answer:
			// asked the other way round, the killed plugin, still dying, answered and gc's probe
			// then found none connected (ci60).
			if now := e.Server.PluginPID("example"); now == pid || now == 0 {
				return false
			}
			rs, err := inv.Resources(ctx)
			return err == nil && len(rs) == 1 && rs[0].ID == db.ID && rs[0].Tag(provider.TagInstance) == db.Tag(provider.TagInstance)
		}, "the restarted plugin does not list db as before")
		dbPID = 0
	}

	// The stack's record goes behind kloud's back: gc finds its machine and removes it.
	if err := e.Server.Store().Stacks().Delete(ctx, sid); err != nil {
		t.Fatal(err)
	}
	dry, err := admin.GCRun(ctx, api.GCRunParams{DryRun: true, Provider: "example"})
	if err != nil {
		t.Fatal(err)
	}
	if len(dry.Garbage) != 1 || dry.Garbage[0].Resource.ID != db.ID || dry.Garbage[0].Removed || !strings.Contains(dry.Garbage[0].Reason, "no longer exists") {
		t.Fatalf("gc --dry-run: %+v", dry)
	}
	if pid := supervisorPID(t, mdir("db")); pid != dbPID {
		t.Fatalf("db after gc --dry-run: supervisor %d, was %d", pid, dbPID)
	}
	if _, err := os.Stat(mdir("db")); err != nil {
		t.Fatalf("db's disk after gc --dry-run: %v", err)
	}
	res, err := admin.GCRun(ctx, api.GCRunParams{Provider: "example"})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Garbage) != 1 || !res.Garbage[0].Removed {
		t.Fatalf("gc: %+v", res)
	}
	if procs := machineProcs(mdir("db")); len(procs) != 0 {
		t.Fatalf("db's processes after gc: %v", procs)
	}
	if _, err := os.Stat(filepath.Join(e.dir, "machines", sid)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the stack's directory after gc: %v", err)
	}
	if again, err := admin.GCRun(ctx, api.GCRunParams{Provider: "example"}); err != nil || len(again.Garbage) != 0 {
		t.Fatalf("gc again: %+v %v", again, err)
	}
	if procs := machineProcs(e.dir + "/"); len(procs) != 0 {
		t.Fatalf("machine processes left: %v", procs)
	}
}

// supervisorPID is the pid of the machine's agent supervisor (its pid file's, if that process
// is the machine's; 0: none).
func supervisorPID(t *testing.T, dir string) int {
	t.Helper()
	b, _ := os.ReadFile(filepath.Join(dir, userdata.SupervisorPIDPath))
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || !slices.Contains(machineProcs(dir), pid) {
		return 0
	}
	return pid
}
