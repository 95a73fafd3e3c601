package e2e

// `kloud stack apply` of a stack that is already built (issue 18 §1), through the CLI, for
// local, docker and vagrant machines: it succeeds and changes nothing (an update of the stack's
// own files, which Terraform finds up to date): the same machine records, kite ids, agents and
// disks. They need what the provider's other e2e tests need (root, the base image, dockerd,
// vagrant); outside CI they skip loudly, under CI=true they fail.

import (
	"fmt"
	"strings"
	"testing"
)

// reapply runs `kloud stack apply` of built stack sid and checks that it succeeded and kept
// every machine as it was before (record, kite id, agent connected, Running), waited for no
// agent, and left the file written to each machine's disk (read, a machine's exec: cat path).
func (e *env) reapply(sid, what string, before map[string]machine, read func(m machine, path string) string, word string) {
	t := e.t
	t.Helper()
	out, err := e.try("stack", "apply", sid)
	if err != nil || !strings.Contains(out, "Stack building finished") {
		t.Fatalf("%s: %v\n%s", what, err, out)
	}
	after := e.machines(sid)
	if len(after) != len(before) {
		t.Fatalf("%s: machines %+v, were %+v", what, after, before)
	}
	for label, b := range before {
		a := after[label]
		if a.ID != b.ID || a.KiteID != b.KiteID || a.sandboxID() != b.sandboxID() || a.State != "Running" || a.Agent.Status != "connected" {
			t.Fatalf("%s: %s was %+v\nis %+v", what, label, b, a)
		}
		if strings.Contains(out, label+": agent connected") {
			t.Errorf("%s waited for %s's agent (a machine it kept):\n%s", what, label, out)
		}
		if got := read(a, "/root/kept"); got != word {
			t.Errorf("%s: %s's /root/kept = %q, want %q", what, label, got, word)
		}
	}
	t.Logf("%s:\n%s", what, out)
}

// writeKept writes word to /root/kept of every machine (write: a machine's exec of sh -c).
func writeKept(ms map[string]machine, word string, write func(m machine, script string)) {
	for _, m := range ms {
		write(m, "echo "+word+" > /root/kept && sync")
	}
}

// TestLocalReapply: a built stack of two local machines (with tags of the template's, which
// kloud adds its own to) applied again, twice: both times a success that keeps the machines.
// Then one machine is destroyed behind kloud's back: apply builds only that one again.
func TestLocalReapply(t *testing.T) {
	parallel(t)
	e := newLocalEnv(t)
	e.alice()
	tid := e.template(`terraform {
  required_providers {
    kloudlocal = { source = "kloud/kloudlocal" }
  }
}

resource "kloudlocal_machine" "dev" {
  count     = 2
  hostname  = "dev-${count.index}"
  memory    = 512
  tags      = { team = "a" }
  user_data = <<-EOT
    #!/bin/bash
    echo hi > /root/user-script-ran
  EOT
}
`)
	sid := e.createStack(tid)
	e.apply(sid)
	before := e.machines(sid)
	if len(before) != 2 {
		t.Fatalf("machines after apply: %+v", before)
	}
	word := randomWord()
	writeKept(before, word, func(m machine, script string) { e.exec(m.sandboxID(), "sh", "-c", script) })
	read := func(m machine, path string) string { return e.exec(m.sandboxID(), "cat", path) }
	for i := range 2 {
		e.reapply(sid, fmt.Sprintf("apply of the built stack (%d)", i+1), before, read, word)
	}

	// Drift: dev.1's machine destroyed behind kloud's back. apply builds it again (the same
	// record, a new machine and agent) and leaves dev.0 alone.
	if err := e.h.Manager.Destroy(t.Context(), before["dev.1"].sandboxID()); err != nil {
		t.Fatal(err)
	}
	out := e.apply(sid)
	t.Logf("apply after dev.1's machine was destroyed:\n%s", out)
	after := e.machines(sid)
	d0, d1 := after["dev.0"], after["dev.1"]
	if d0.ID != before["dev.0"].ID || d0.KiteID != before["dev.0"].KiteID || d0.sandboxID() != before["dev.0"].sandboxID() || d0.State != "Running" ||
		strings.Contains(out, "dev.0: agent connected") || read(d0, "/root/kept") != word {
		t.Errorf("dev.0 changed by the apply of dev.1's drift: was %+v\nis %+v\n%s", before["dev.0"], d0, out)
	}
	if d1.ID != before["dev.1"].ID || d1.sandboxID() == before["dev.1"].sandboxID() || d1.KiteID == before["dev.1"].KiteID ||
		d1.State != "Running" || d1.Agent.Status != "connected" || !strings.Contains(out, "dev.1: agent connected") {
		t.Fatalf("dev.1 not built again: was %+v\nis %+v\n%s", before["dev.1"], d1, out)
	}
	if got := read(d1, "/root/user-script-ran"); got != "hi" {
		t.Errorf("dev.1 built again: user script wrote %q", got)
	}
	e.run("stack", "destroy", sid)
}

// TestDockerReapply: a built stack of a docker machine applied again keeps it.
func TestDockerReapply(t *testing.T) {
	parallel(t)
	e := newDockerEnv(t)
	e.alice()
	sid := e.createStack(e.template(dockerTemplate("dev", 1)))
	e.apply(sid)
	before := e.machines(sid)
	word := randomWord()
	writeKept(before, word, func(m machine, script string) { e.exec(containerID(m), "sh", "-c", script) })
	e.reapply(sid, "apply of the built docker stack", before, func(m machine, path string) string { return e.exec(containerID(m), "cat", path) }, word)
	e.run("stack", "destroy", sid)
	if left := e.leftovers(); len(left) > 0 {
		t.Errorf("left on the daemon after destroy: %q", left)
	}
}

// TestVagrantReapply: a built stack of a vagrant machine applied again keeps it.
func TestVagrantReapply(t *testing.T) {
	parallel(t)
	e := newVagrantEnv(t)
	sid := e.createStack(e.template(vagrantTemplate("dev", 1, `#!/bin/bash
echo hi > /root/user-script-ran`)))
	e.apply(sid)
	before := e.machines(sid)
	word := randomWord()
	in := func(m machine) string { return e.container(m.sandboxID()) }
	writeKept(before, word, func(m machine, script string) { e.exec(in(m), "sh", "-c", script) })
	e.reapply(sid, "apply of the built vagrant stack", before, func(m machine, path string) string { return e.exec(in(m), "cat", path) }, word)
	e.run("stack", "destroy", sid)
}
