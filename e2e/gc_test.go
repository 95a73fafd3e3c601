package e2e

// End-to-end test of kloud's garbage collector (kloud gc, the periodic sweep) with the local
// provider: real machines whose records are deleted from kloud's store behind its back.

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/local"
	"github.com/kloud-dev/kloud/providers/local/sandbox"
	"github.com/kloud-dev/kloud/providers/local/tfprovider/tfprovidertest"
)

// gc runs `kloud gc` as the administrator (the CLI's user may be alice).
func (e *env) gc(args ...string) string {
	e.t.Helper()
	return e.run(append([]string{"gc", "--key", filepath.Join(e.dir, kloud.AdminKeyFile)}, args...)...)
}

// behindBack stops kloud, runs fn on its store (opened as kloud opens it) and starts kloud again
// with extra flags.
func (e *localEnv) behindBack(fn func(ctx context.Context, st *store.Store), extra ...string) {
	t := e.t
	t.Helper()
	e.kill()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	st, err := store.Open(ctx, store.Options{DataDir: e.dir})
	if err != nil {
		t.Fatalf("open kloud's store: %v", err)
	}
	fn(ctx, st)
	if err := st.Close(ctx); err != nil {
		t.Fatal(err)
	}
	e.extra = append(e.extra, extra...)
	e.start()
}

// TestLocalGC: a 2-machine local stack; one machine's record is deleted behind kloud's back, and
// a machine of the stack that no Terraform state holds appears (what a build that died after the
// create leaves), and a machine's directory vanishes while it runs (what a destroy that failed
// half-way leaves: its namespace, veth and cgroup): `kloud gc --dry-run` names the three (the
// leftovers with the machine they belonged to) and removes nothing, `kloud gc` removes them and
// leaves the other machine; then the stack's record is deleted and the periodic sweep removes the
// last machine.
// Every machine carries kloud's tags (stack, team, owner, machine, instance).
func TestLocalGC(t *testing.T) {
	parallel(t)
	e := newLocalEnv(t)
	e.alice()
	sid := e.createStack(e.template(localTemplate("gc", 2, "#!/bin/bash\necho gc")))
	e.apply(sid)
	ms := e.machines(sid)
	m0, m1 := ms["gc.0"], ms["gc.1"]
	id0, id1 := m0.sandboxID(), m1.sandboxID()
	infos := e.sandboxInfos()
	for _, m := range []machine{m0, m1} {
		in, err := e.h.Manager.Info(t.Context(), m.sandboxID())
		if err != nil {
			t.Fatal(err)
		}
		for k, want := range map[string]string{"kloud_stack": sid, "kloud_machine": m.ID, "kloud_owner": "alice", "kloud_team": "default"} {
			if in.Tags[k] != want {
				t.Errorf("%s: tag %s = %q, want %q (tags %v)", m.Label, k, in.Tags[k], want, in.Tags)
			}
		}
		if in.Instance == "" {
			t.Errorf("%s: no instance recorded", m.Label)
		}
	}

	// Nothing is garbage while kloud has the stack and its machines.
	if out := e.gc("--dry-run"); !strings.Contains(out, "no garbage") {
		t.Fatalf("gc --dry-run of a healthy stack:\n%s", out)
	}

	// A build that died after the machine service created a machine and before terraform
	// recorded it leaves a machine of this kloud, tagged for machine gc.0, that no state holds.
	stray, err := e.h.Manager.Create(t.Context(), sandbox.Spec{ID: "stray-" + randomWord(), Hostname: "stray",
		Tags: map[string]string{"kloud_stack": sid, "kloud_machine": m0.ID}, Instance: instanceOf(t, e.h, id0)})
	if err != nil {
		t.Fatal(err)
	}

	// Machine gc.1's record goes; no sweep runs by itself, and nothing is too young.
	e.behindBack(func(ctx context.Context, st *store.Store) {
		if _, err := st.Collection(store.CollMachines).DeleteOne(ctx, bson.M{"_id": m1.ID}); err != nil {
			t.Fatal(err)
		}
	}, "--gc-interval", "0", "--gc-grace", "0")
	// A machine of this kloud whose directory (machine.json with it) vanished while it ran: what
	// a destroy that failed half-way or a crash inside its directory's removal leaves: its
	// namespace, veth and cgroup (with its processes) are leftovers, garbage whatever its tags say.
	// (Created after kloud's restart: kloud serve's startup tidy removes leftovers too.)
	lost, err := e.h.Manager.Create(t.Context(), sandbox.Spec{ID: "lost-" + randomWord(), Hostname: "lost",
		Tags: map[string]string{"kloud_stack": sid, "kloud_machine": m0.ID}, Instance: instanceOf(t, e.h, id0)})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(lost.Dir); err != nil {
		t.Fatal(err)
	}
	var dry api.GCResult
	e.runJSON(&dry, "gc", "--dry-run", "--key", filepath.Join(e.dir, kloud.AdminKeyFile))
	found := map[string]api.GCItem{}
	for _, g := range dry.Garbage {
		found[g.Resource.ID] = g
	}
	if len(dry.Garbage) != 3 || found[id1].Removed || !strings.Contains(found[id1].Reason, "has no machine "+m1.ID) ||
		!strings.Contains(found[stray.ID].Reason, "not in the Terraform state") {
		t.Fatalf("gc --dry-run: %+v, want machine %s (gc.1: its record is gone), %s (not in the state) and %s's leftovers, not removed", dry, id1, stray.ID, lost.ID)
	}
	if lo := found[lost.ID]; lo.Removed || !lo.Resource.Orphan || lo.Resource.Kind != "leftovers" || !strings.Contains(lo.Reason, "left over") ||
		!strings.Contains(lo.Resource.Name, "netns "+lost.Netns) || lo.Resource.Tag(provider.TagMachine) != m0.ID {
		t.Fatalf("gc --dry-run: leftovers of %s: %+v", lost.ID, lo)
	}
	if los, err := e.h.Manager.Leftovers(t.Context()); err != nil || len(los) != 1 || los[0].Netns != lost.Netns || !isNetns(lost.Netns) {
		t.Fatalf("leftovers after gc --dry-run: %+v %v", los, err)
	}
	g := found[id1].Resource
	for k, want := range map[string]string{provider.TagStack: sid, provider.TagMachine: m1.ID, provider.TagOwner: "alice", provider.TagTeam: "default"} {
		if g.Tag(k) != want {
			t.Errorf("listed resource: tag %s = %q, want %q (%v)", k, g.Tag(k), want, g.Tags)
		}
	}
	if g.Tag(provider.TagInstance) == "" || g.CreatedAt.IsZero() {
		t.Errorf("listed resource without instance or creation time: %+v", g)
	}
	for _, id := range []string{id0, id1, stray.ID} {
		if in, err := e.h.Manager.Info(t.Context(), id); err != nil || in.State != sandbox.StateRunning {
			t.Fatalf("machine %s after gc --dry-run: %+v %v", id, in, err)
		}
	}
	out := e.gc()
	if !strings.Contains(out, id1) || !strings.Contains(out, stray.ID) || !strings.Contains(out, lost.ID) || !strings.Contains(out, "removed") {
		t.Fatalf("gc:\n%s", out)
	}
	if los, err := e.h.Manager.Leftovers(t.Context()); err != nil || len(los) != 0 || isNetns(lost.Netns) || linkExists(lost.HostVeth) {
		t.Fatalf("leftovers after gc: %+v %v", los, err)
	}
	t.Logf("gc:\n%s", out)
	for _, id := range []string{id1, stray.ID} {
		if in, err := e.h.Manager.Info(t.Context(), id); err != nil || in.State != sandbox.StateAbsent {
			t.Fatalf("machine %s after gc: %+v %v", id, in, err)
		}
	}
	if out := e.gc("--dry-run"); !strings.Contains(out, "no garbage") {
		t.Errorf("gc --dry-run after gc:\n%s", out)
	}
	if in, err := e.h.Manager.Info(t.Context(), id0); err != nil || in.State != sandbox.StateRunning {
		t.Fatalf("machine %s (still wanted) after gc: %+v %v", id0, in, err)
	}

	// The stack's record goes: the periodic sweep removes its last machine.
	e.behindBack(func(ctx context.Context, st *store.Store) {
		if err := st.Stacks().Delete(ctx, sid); err != nil {
			t.Fatal(err)
		}
	}, "--gc-interval", "1s")
	testutil.Eventually(t, time.Minute, func() bool {
		in, err := e.h.Manager.Info(t.Context(), id0)
		return err == nil && in.State == sandbox.StateAbsent
	}, "machine %s of a deleted stack: the periodic sweep did not remove it", id0)
	// kloud logs the removal once the provider returns, just after the machine is gone.
	testutil.Eventually(t, 10*time.Second, func() bool { return strings.Contains(e.kloudOut.String(), "no longer exists") },
		"kloud did not log why it removed machine %s:\n%s", id0, e.kloudOut)
	e.assertNothingLeft(infos)
}

// instanceOf is the kloud instance recorded in local machine id.
func instanceOf(t *testing.T, h *tfprovidertest.Host, id string) string {
	t.Helper()
	in, err := h.Manager.Info(t.Context(), id)
	if err != nil || in.Instance == "" {
		t.Fatalf("machine %s: no instance: %+v %v", id, in, err)
	}
	return in.Instance
}

// isNetns says whether network namespace name is in /run/netns.
func isNetns(name string) bool {
	_, err := os.Stat(filepath.Join("/run/netns", name))
	return err == nil
}

// linkExists says whether the host has network interface name.
func linkExists(name string) bool {
	_, err := os.Stat(filepath.Join("/sys/class/net", name))
	return err == nil
}

// TestLocalTerraformerKilledAfterCreate: terraformer is SIGKILLed once kloud created a machine
// for terraform and before terraform wrote it into the stack's state (the test freezes terraform
// while the create runs): first in a build (the first of two machines), then in an update that
// scales the second resource to 2. Once a terraformer is back, each job runs terraform again and
// succeeds, and what the dead run made and did not record is gone when the job ends: the job
// removed it (gc would not have: its grace period keeps a machine 10 minutes). The host then
// holds exactly the stack's machines, and a destroy leaves none.
func TestLocalTerraformerKilledAfterCreate(t *testing.T) {
	parallel(t)
	e := newLocalEnv(t)
	e.alice()
	script := indent("#!/bin/bash\necho strays")
	sid := e.createStack(e.template(`terraform {
  required_providers {
    kloudlocal = { source = "kloud/kloudlocal" }
  }
}

resource "kloudlocal_machine" "first" {
  hostname  = "first"
  memory    = 512
  user_data = <<-EOT
` + script + `
  EOT
}

resource "kloudlocal_machine" "second" {
  count      = 1
  hostname   = "second-${count.index}"
  memory     = 512
  depends_on = [kloudlocal_machine.first]
  user_data  = <<-EOT
` + script + `
  EOT
}
`))
	// The test's terraformer (newTerraformerEnv), to kill and start again as it was.
	var tf osProc
	for _, p := range allProcs() {
		if p.ppid == os.Getpid() && p.comm == "terraformer" && strings.Contains(p.cmdline, e.dir) {
			tf = p
		}
	}
	if tf.pid == 0 {
		t.Fatal("no terraformer of this test found")
	}
	mine := func() map[string]sandbox.Info {
		out := map[string]sandbox.Info{}
		for _, in := range e.sandboxInfos() {
			if in.Tags[local.TagStack] == sid {
				out[in.ID] = in
			}
		}
		return out
	}
	// killAfterCreate runs the job that cmd starts (detached), kills tf once kloud created a
	// machine of the stack not in known for it, starts a terraformer again as tf was, and checks
	// the job ran terraform again (its log saying rerun) and succeeded. It returns the new
	// terraformer.
	killAfterCreate := func(tf osProc, known map[string]sandbox.Info, rerun string, cmd ...string) osProc {
		t.Helper()
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", tf.pid))
		if err != nil {
			t.Fatal(err)
		}
		args := strings.Split(strings.TrimSuffix(string(raw), "\x00"), "\x00")
		out := e.run(append(cmd, "--detach")...)
		jobID := strings.Fields(strings.TrimPrefix(out, "job "))[0]
		var made sandbox.Info
		testutil.Eventually(t, 3*time.Minute, func() bool {
			for id, in := range mine() {
				if _, ok := known[id]; !ok {
					made = in
					return true
				}
			}
			return false
		}, "terraform never began a machine")
		// Freeze terraform (every process under terraformer), let kloud finish the create, then
		// kill terraformer: terraform never heard of the machine, let alone recorded it.
		for _, p := range tree(tf.pid) {
			if p.pid != tf.pid {
				syscall.Kill(p.pid, syscall.SIGSTOP)
			}
		}
		testutil.Eventually(t, time.Minute, func() bool {
			in, err := e.h.Manager.Info(t.Context(), made.ID)
			return err == nil && in.State == sandbox.StateRunning
		}, "the create of %s did not finish", made.ID)
		syscall.Kill(tf.pid, syscall.SIGKILL)
		t.Logf("killed terraformer %d after the create of %s; the stack's machines on the host: %v", tf.pid, made.ID, slices.Collect(maps.Keys(mine())))
		testutil.Eventually(t, 30*time.Second, func() bool { return !tf.alive() }, "terraformer %d still runs", tf.pid)
		cmdTF := testutil.StartProcess(t, args[0], args[1:]...)
		next, ok := readProc(cmdTF.Process.Pid)
		if !ok {
			t.Fatal("the new terraformer is gone")
		}
		removed := false
		for _, l := range e.rerunSucceeded(jobID, rerun) {
			if strings.Contains(l, "the dead run made it") {
				t.Logf("job log: %s", l)
				removed = removed || strings.Contains(l, made.ID)
			}
		}
		if !removed {
			t.Errorf("the job's log does not say it removed %s", made.ID)
		}
		return next
	}
	// exactly checks that the host holds exactly the stack's n machines, all running with their
	// agent connected.
	exactly := func(n int) map[string]sandbox.Info {
		t.Helper()
		ms := e.machines(sid)
		want := map[string]bool{}
		for l, m := range ms {
			if m.State != "Running" || m.Agent.Status != "connected" {
				t.Fatalf("%s: %+v", l, m)
			}
			want[m.sandboxID()] = true
		}
		got := mine()
		if len(ms) != n || len(got) != len(want) {
			t.Fatalf("the stack's machines %v, the host's machines of the stack %v; want %d", want, slices.Collect(maps.Keys(got)), n)
		}
		for id := range got {
			if !want[id] {
				t.Fatalf("machine %s of the stack is on the host, but no machine of the stack is it (the stack's: %v)", id, want)
			}
		}
		return got
	}

	tf = killAfterCreate(tf, nil, "running it again", "stack", "apply", sid)
	built := exactly(2)
	killAfterCreate(tf, built, "updating again", "stack", "scale", sid, "second", "2")
	exactly(3)
	e.run("stack", "destroy", sid)
	if left := mine(); len(left) != 0 {
		t.Fatalf("after the destroy: %v", slices.Collect(maps.Keys(left)))
	}
}
