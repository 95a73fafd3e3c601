package e2e

// Stack update and scale (issue 13 §1) through the CLI. TestKloudKilledMidUpdate: dummy
// machines, kloud SIGKILLed mid-update. TestLocalStackUpdate: real local machines: a 2-machine
// stack updated to a revision that adds a third machine and changes the memory of one (which
// replaces it); the unchanged machine keeps its disk, its agent and an open terminal session;
// then scale 3 → 1 → 3; then a revision with no local machine (only a dummy one) removes them
// all. Needs root and the base image (skips loudly otherwise, fails under
// CI=true).

import (
	"context"
	"fmt"
	"github.com/kloud-dev/kloud/internal/testutil"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// updateTemplate is n machines web.<i>; with bigOne, web.1 has 640 MiB instead of 512.
func updateTemplate(n int, bigOne bool) string {
	mem := "512"
	if bigOne {
		mem = "count.index == 1 ? 640 : 512"
	}
	return fmt.Sprintf(`terraform {
  required_providers {
    kloudlocal = { source = "kloud/kloudlocal" }
  }
}

resource "kloudlocal_machine" "web" {
  count     = %d
  hostname  = "web-${count.index}"
  memory    = %s
  user_data = <<-EOT
    #!/bin/bash
    echo "user script ran on $(hostname)" > /root/user-script-ran
  EOT
}
`, n, mem)
}

func TestLocalStackUpdate(t *testing.T) {
	parallel(t)
	e := newLocalEnv(t)
	e.alice()
	tid := e.template(updateTemplate(2, false))
	sid := e.createStack(tid)
	if out := e.run("stack", "apply", sid); !strings.Contains(out, "Stack building finished") {
		t.Fatalf("apply:\n%s", out)
	}
	before := e.machines(sid)
	web0, web1 := before["web.0"], before["web.1"]
	if web0.State != "Running" || web1.State != "Running" {
		t.Fatalf("after apply: %+v", before)
	}
	id0 := web0.sandboxID()
	word := randomWord()
	e.exec(id0, "sh", "-c", "echo "+word+" > /root/kept && sync")
	term := e.terminal(t, e.key, web0.ID, "session=upd-s")
	term.Type(t, "echo BEFORE=$((20+1))\r")
	term.WaitFor(t, "BEFORE=21")

	// Revision 2: a third machine, web.1 with more memory.
	f := filepath.Join(t.TempDir(), "main.tf")
	if err := os.WriteFile(f, []byte(updateTemplate(3, true)), 0o644); err != nil {
		t.Fatal(err)
	}
	e.run("template", "update", tid, "--file", f)
	var st struct {
		TemplateRev, LatestRev int
		UpdateAvailable        bool
	}
	e.runJSON(&st, "stack", "describe", sid)
	if st.TemplateRev != 1 || st.LatestRev != 2 || !st.UpdateAvailable {
		t.Fatalf("describe before update: %+v", st)
	}
	plan := e.run("stack", "update", sid, "--plan")
	for _, want := range []string{"revision 1 → revision 2", "web.0", "keep", "memory: 512 → 640", "web.2", "1 add, 1 replace, 1 keep"} {
		if !strings.Contains(plan, want) {
			t.Errorf("plan does not say %q:\n%s", want, plan)
		}
	}
	if strings.Contains(plan, "eyJ") {
		t.Fatalf("the plan shows a key:\n%s", plan)
	}
	if ms := e.machines(sid); len(ms) != 2 || ms["web.1"].sandboxID() != web1.sandboxID() {
		t.Fatalf("the plan changed machines: %+v", ms)
	}

	out := e.run("stack", "update", sid)
	if !strings.Contains(out, "Stack building finished") || !strings.Contains(out, "web.2: agent connected") || !strings.Contains(out, "web.1: agent connected") {
		t.Fatalf("update:\n%s", out)
	}
	if strings.Contains(out, "web.0: agent connected") {
		t.Errorf("the update waited for web.0's agent, which it kept:\n%s", out)
	}
	after := e.machines(sid)
	a0, a1, a2 := after["web.0"], after["web.1"], after["web.2"]
	if a0.ID != web0.ID || a0.KiteID != web0.KiteID || a0.sandboxID() != id0 || a0.State != "Running" || a0.Agent.Status != "connected" {
		t.Fatalf("web.0 changed: before %+v\nafter %+v", web0, a0)
	}
	if got := e.exec(id0, "cat", "/root/kept"); got != word {
		t.Errorf("web.0's /root/kept = %q, want %q", got, word)
	}
	term.Type(t, "echo AFTER=$((20+2))\r")
	term.WaitFor(t, "AFTER=22")
	if body := e.sessions(t, web0.ID); !strings.Contains(body, "upd-s") {
		t.Errorf("web.0's terminal sessions after the update: %s", body)
	}
	if a1.ID != web1.ID || a1.sandboxID() == web1.sandboxID() || a1.KiteID == web1.KiteID || a1.State != "Running" || a1.Agent.Status != "connected" {
		t.Fatalf("web.1 not replaced: before %+v\nafter %+v", web1, a1)
	}
	if mem, _ := a1.Attributes["memory"].(float64); mem != 640 {
		t.Errorf("web.1's memory attribute: %v", a1.Attributes["memory"])
	}
	if a2.State != "Running" || a2.Agent.Status != "connected" {
		t.Fatalf("web.2: %+v", a2)
	}
	if got := e.exec(a2.sandboxID(), "cat", "/root/user-script-ran"); got != "user script ran on web-2" {
		t.Errorf("web.2's user script: %q", got)
	}
	if _, ok := e.kites()[web1.KiteID]; ok {
		t.Errorf("web.1's old agent %s is still registered", web1.KiteID)
	}
	st.UpdateAvailable = false // omitted when false
	e.runJSON(&st, "stack", "describe", sid)
	if st.TemplateRev != 2 || st.UpdateAvailable {
		t.Fatalf("describe after update: %+v", st)
	}

	// Scale 3 → 1 → 3: web.0 stays through it all.
	for _, n := range []int{1, 3} {
		out := e.run("stack", "scale", sid, "web", fmt.Sprint(n))
		if !strings.Contains(out, "Stack building finished") {
			t.Fatalf("scale to %d:\n%s", n, out)
		}
		ms := e.machines(sid)
		if len(ms) != n {
			t.Fatalf("after scale to %d: %d machines: %+v", n, len(ms), ms)
		}
		for l, m := range ms {
			if m.State != "Running" || m.Agent.Status != "connected" {
				t.Errorf("after scale to %d: %s is %s, agent %s", n, l, m.State, m.Agent.Status)
			}
		}
		if infos := e.sandboxInfos(); len(infos) != n {
			t.Errorf("sandbox machines after scaling to %d: %+v", n, infos)
		}
		if m := ms["web.0"]; m.ID != web0.ID || m.sandboxID() != id0 || m.KiteID != web0.KiteID {
			t.Fatalf("scale to %d changed web.0: %+v", n, m)
		}
	}
	term.Type(t, "echo LAST=$((20+3))\r")
	term.WaitFor(t, "LAST=23")

	// Revision 3 has no local machine, only a dummy one: every local machine goes (the local
	// provider still configures Terraform to destroy them) and the dummy one is built.
	infos := e.sandboxInfos()
	if err := os.WriteFile(f, []byte("resource \"terraform_data\" \"other\" {\n  input = \"#!/bin/bash\\necho other\"\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	e.run("template", "update", tid, "--file", f)
	if out := e.run("stack", "update", sid); !strings.Contains(out, "other: agent connected") {
		t.Fatalf("update to a revision without local machines:\n%s", out)
	}
	if ms := e.machines(sid); len(ms) != 1 || ms["other"].State != "Running" {
		t.Fatalf("machines after the update to a revision without local machines: %+v", ms)
	}
	e.assertNothingLeft(infos)
	e.run("stack", "destroy", sid)
}

// sessions is the body of kloud's terminal session list of machine id, as the CLI's user.
func (e *localEnv) sessions(t *testing.T, id string) string {
	t.Helper()
	key, err := os.ReadFile(e.key)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s/api/machines/%s/sessions", e.addr, id), nil)
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(key)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("sessions of %s: HTTP %d: %s", id, resp.StatusCode, b)
	}
	return string(b)
}

// killedUpdateRev is a template of dummy machines: "keep" (never changes), "old" (withOld) and
// n "vm"s whose user script sleeps, so kloud waits for their agents a while.
func killedUpdateRev(n int, withOld bool) string {
	out := "resource \"terraform_data\" \"keep\" {\n  input = \"#!/bin/bash\\necho kept\"\n}\n"
	if withOld {
		out += "resource \"terraform_data\" \"old\" {\n  input = \"#!/bin/bash\\necho old\"\n}\n"
	}
	if n > 0 {
		out += fmt.Sprintf("resource \"terraform_data\" \"vm\" {\n  count = %d\n  input = \"#!/bin/bash\\necho working; sleep 6; echo done\"\n}\n", n)
	}
	return out
}

// TestKloudKilledMidUpdate SIGKILLs kloud (terraformer runs on its own and survives) during three
// updates of a dummy stack, before the update's terraform run is recorded, while terraform
// applies and while kloud waits for the new agents, and starts it again each time: the update job resumes and ends with the stack updated (or, if
// it failed, `stack apply` converges it); no machine stays Building or Terminating, no label is
// recorded twice, the kept machine keeps its record and key, and destroy leaves nothing.
func TestKloudKilledMidUpdate(t *testing.T) {
	parallel(t)
	e := newTerraformerEnv(t, testutil.FreeLoopback(t), "")
	e.alice()
	tid := e.template(killedUpdateRev(0, true))
	sid := e.createStack(tid)
	e.apply(sid)
	keep := e.machines(sid)["keep"]

	for _, tc := range []struct {
		name    string
		percent int // kill once the job has reached this
		rev     string
		want    []string
	}{
		{"before terraform's run is recorded", 20, killedUpdateRev(1, false), []string{"keep", "vm.0"}},
		{"while terraform applies", 40, killedUpdateRev(2, false), []string{"keep", "vm.0", "vm.1"}},
		{"while waiting for agents", 70, killedUpdateRev(3, false), []string{"keep", "vm.0", "vm.1", "vm.2"}},
	} {
		f := filepath.Join(t.TempDir(), "main.tf")
		os.WriteFile(f, []byte(tc.rev), 0o644)
		e.run("template", "update", tid, "--file", f)
		out := e.run("stack", "update", sid, "--detach") // the plan, then "job ID started; …"
		m := regexp.MustCompile(`job (\S+) started`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("%s: stack update:\n%s", tc.name, out)
		}
		j := e.killAt(m[1], tc.percent, 3*time.Minute, tc.name)
		if j.Status != "succeeded" {
			var st struct{ State, Reason string }
			e.runJSON(&st, "stack", "describe", sid)
			if j.Error == "" || st.State == "Building" || st.Reason == "" {
				t.Fatalf("%s: a failed update must say why: job %+v, stack %+v", tc.name, j, st)
			}
			t.Logf("%s: the resumed update failed (%s); apply converges the stack", tc.name, j.Error)
			e.run("stack", "apply", sid)
		}
		var ms []machine
		e.runJSON(&ms, "machine", "list", "--stack", sid)
		var labels []string
		for _, m := range ms {
			labels = append(labels, m.Label)
			if m.State != "Running" || m.Agent.Status != "connected" {
				t.Errorf("%s: %s after the update: %+v", tc.name, m.Label, m)
			}
		}
		slices.Sort(labels)
		if !slices.Equal(labels, tc.want) {
			t.Fatalf("%s: machines after the update: %v, want %v", tc.name, labels, tc.want)
		}
		if k := e.machines(sid)["keep"]; k.ID != keep.ID || k.KiteID != keep.KiteID {
			t.Fatalf("%s: keep changed: %+v, was %+v", tc.name, k, keep)
		}
	}
	// The CLI's scale and update show a refusal at the call, and no job starts: a resource
	// without count; a revision without machines (the plan the update shows first refuses it).
	if out, err := e.try("stack", "scale", sid, "keep", "0"); err == nil || !strings.Contains(out, "count = 1") || strings.Contains(out, "started") {
		t.Fatalf("stack scale of a resource without count: %v\n%s", err, out)
	}
	f := filepath.Join(t.TempDir(), "main.tf")
	os.WriteFile(f, []byte("variable \"x\" {\n  default = 1\n}\n"), 0o644)
	e.run("template", "update", tid, "--file", f)
	if out, err := e.try("stack", "update", sid); err == nil || !strings.Contains(out, "destroy the stack instead") || strings.Contains(out, "started") {
		t.Fatalf("stack update to a revision without machines: %v\n%s", err, out)
	}
	e.run("stack", "destroy", sid)
	if entries, _ := os.ReadDir(filepath.Join(e.dir, "machines", sid)); len(entries) != 0 {
		t.Fatalf("machine directories left: %v", entries)
	}
}
