package e2e

import (
	"encoding/json"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// constrainedTemplate is one kloudlocal machine whose memory, cpus and disk_mb come from
// variables.
const constrainedTemplate = `terraform {
  required_providers {
    kloudlocal = { source = "kloud/kloudlocal" }
  }
}

variable "mem" {
  default = 300
}
variable "cpus" {
  default = 0.5
}

resource "kloudlocal_machine" "box" {
  hostname  = "box"
  memory    = var.mem
  cpus      = var.cpus
  disk_mb   = 256
  user_data = <<-EOT
    #!/bin/bash
    nproc > /root/nproc
  EOT
}
`

// TestLocalConstraints: provider describe shows the local provider's constraints; a plan
// asking for more memory or CPUs than the host has is refused with the attribute, what is
// allowed and the nearest valid value, and nothing is created; a machine within them is built
// and, inside, df shows its disk quota, free its memory and nproc its CPUs.
func TestLocalConstraints(t *testing.T) {
	parallel(t)
	e := newLocalEnv(t)
	e.alice()

	var desc []struct {
		Name        string
		Constraints []struct {
			Name, Attribute string
			Max             *float64
		}
	}
	e.runJSON(&desc, "provider", "describe", "local")
	if len(desc) != 1 || len(desc[0].Constraints) == 0 {
		t.Fatalf("provider describe local: %+v: want its constraints", desc)
	}
	var memMax float64
	for _, c := range desc[0].Constraints {
		if c.Name == "mem" && c.Max != nil {
			memMax = *c.Max
		}
	}
	if memMax < 300 {
		t.Fatalf("provider describe local: mem constraint %+v: want a maximum (the host's memory)", desc[0].Constraints)
	}

	tid := e.template(constrainedTemplate)
	tooMuch := strconv.Itoa(int(memMax) * 4)
	out, err := e.try("stack", "plan", "--template", tid, "--var", "mem="+tooMuch)
	if err == nil {
		t.Fatalf("stack plan with mem=%s: accepted:\n%s", tooMuch, out)
	}
	for _, want := range []string{"machine box (kloudlocal_machine.box)", "mem (memory) " + tooMuch + " MB is more than the", "this host allows",
		"nearest valid: " + strconv.Itoa(int(memMax))} {
		if !strings.Contains(out, want) {
			t.Errorf("stack plan with mem=%s: output does not say %q:\n%s", tooMuch, want, out)
		}
	}
	t.Logf("stack plan with mem=%s refused:\n%s", tooMuch, out)
	cpus := strconv.Itoa(runtime.NumCPU() + 3)
	out, err = e.try("stack", "create", "--template", tid, "--var", "cpus="+cpus)
	if err == nil || !strings.Contains(out, "cores (cpus) "+cpus+" CPUs is more than the") || !strings.Contains(out, "nearest valid: "+strconv.Itoa(runtime.NumCPU())) {
		t.Fatalf("stack create with cpus=%s: %v:\n%s", cpus, err, out)
	}
	var stacks []json.RawMessage
	e.runJSON(&stacks, "stack", "list")
	if len(stacks) != 0 {
		t.Fatalf("refused creates made stacks: %s", stacks)
	}

	sid := e.createStack(tid)
	e.apply(sid)
	m := e.machines(sid)["box"]
	if m.State != "Running" || m.Agent.Status != "connected" {
		t.Fatalf("box after apply: %+v", m)
	}
	id := m.sandboxID()
	df := strings.Split(e.exec(id, "df", "-m", "--output=size", "/"), "\n")
	if size, err := strconv.Atoi(strings.TrimSpace(df[len(df)-1])); err != nil || size < 200 || size > 256 {
		t.Errorf("df -m / in a machine with disk_mb = 256: %q", df)
	}
	if f := strings.Fields(strings.Split(e.exec(id, "free", "-m"), "\n")[1]); len(f) < 2 || f[1] != "300" {
		t.Errorf("free -m in a machine with memory = 300: %v", f)
	}
	if got := e.exec(id, "cat", "/root/nproc"); got != "1" {
		t.Errorf("nproc in the user script of a machine with cpus = 0.5: %q, want 1", got)
	}
	infos := e.sandboxInfos()
	e.run("stack", "destroy", sid)
	e.assertNothingLeft(infos)
}
