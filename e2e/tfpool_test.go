package e2e

// A pool of terraformers (issue 24, deliverable 3): kloud serve --terraformers 2 runs two on one
// shared directory (terraformer/tfpool); a build whose terraformer is killed mid-apply is taken
// over by the other one.

import (
	"encoding/json"
	"net"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
)

// TestTerraformerPoolTakesOver: kill -9 of the terraformer of a pool of two that runs a build's
// terraform apply, with its address taken so that kloud cannot start it again → the build's run
// is read as died by the other terraformer (the shared directory), kloud runs it again there and
// the build succeeds; the stack is built again and destroyed through the survivor alone.
func TestTerraformerPoolTakesOver(t *testing.T) {
	parallel(t)
	addrs := []string{testutil.FreeLoopback(t), testutil.FreeLoopback(t)}
	e := newEnv(t, "--terraformers", "2", "--terraformer-addr", strings.Join(addrs, ","))
	e.alice()
	tid := e.template(`
resource "terraform_data" "vm" {
  count = 12
  input = "#!/bin/bash\necho hi"
}
`)
	var created struct{ Stack struct{ ID string } }
	e.runJSON(&created, "stack", "create", "--template", tid)
	sid := created.Stack.ID
	var tfs []osProc
	testutil.Eventually(t, time.Minute, func() bool {
		tfs = tfs[:0]
		for _, p := range allProcs() {
			if p.ppid == e.kloud.Process.Pid && p.comm == "terraformer" {
				tfs = append(tfs, p)
			}
		}
		return len(tfs) == 2
	}, "kloud %d does not run two terraformers: %v", e.kloud.Process.Pid, tfs)
	out := e.run("stack", "apply", sid, "--detach")
	jobID := strings.Fields(strings.TrimPrefix(out, "job "))[0]

	// Kill whichever runs the apply, and hold its address.
	var victim osProc
	deadline := time.Now().Add(2 * time.Minute)
	for victim.pid == 0 && time.Now().Before(deadline) {
		for _, tf := range tfs {
			if slices.ContainsFunc(tree(tf.pid), func(p osProc) bool { return p.comm == "terraform" && strings.Contains(p.cmdline, "apply") }) {
				syscall.Kill(tf.pid, syscall.SIGKILL)
				victim = tf
				break
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	if victim.pid == 0 {
		t.Fatalf("no terraformer of the pool ran terraform apply; kloud:\n%s", e.kloudOut)
	}
	killed := time.Now()
	addr := addrs[0]
	if !strings.Contains(victim.cmdline, addr) {
		addr = addrs[1]
	}
	var held net.Listener
	testutil.Eventually(t, 30*time.Second, func() bool {
		var err error
		if held, err = net.Listen("tcp", addr); err == nil {
			return true
		}
		for _, p := range allProcs() { // a restart won the race for the address: kill it too
			if p.ppid == e.kloud.Process.Pid && p.comm == "terraformer" && strings.Contains(p.cmdline, addr) {
				syscall.Kill(p.pid, syscall.SIGKILL)
			}
		}
		return false
	}, "could not take the killed terraformer's address %s", addr)
	t.Cleanup(func() { held.Close() })

	final, _ := e.try("job", "watch", jobID)
	took := time.Since(killed)
	var j struct {
		Status string
		Log    []string
	}
	if err := json.Unmarshal([]byte(e.run("job", "get", jobID)), &j); err != nil {
		t.Fatal(err)
	}
	if j.Status != "succeeded" || !slices.ContainsFunc(j.Log, func(l string) bool { return strings.Contains(l, "died with its process") }) {
		t.Fatalf("the build whose terraformer was killed: want it run again on the other and succeeded: %+v\n%s\nkloud:\n%s", j, final, e.kloudOut)
	}
	t.Logf("the build ended %s after its terraformer was killed (taken over by the other); its log:\n%s", took.Round(time.Millisecond), strings.Join(j.Log, "\n"))
	if !strings.Contains(e.kloudOut.String(), "following it on another") {
		t.Errorf("kloud did not log the pool's failover:\n%s", e.kloudOut)
	}
	e.apply(sid)
	e.run("stack", "destroy", sid)
}
