package example

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/userdata"
)

// TestResumeFailureOnConsole: a machine Resume cannot power on again (its disk lost its
// provisioning) says why on its console, as a failed provisioning step kloud's planner reads,
// so a build waiting for its agent fails at once with the reason; a stopped machine and a
// half-booted one are left alone. (TestPluginRestart powers machines on for real.)
func TestResumeFailureOnConsole(t *testing.T) {
	dir := t.TempDir()
	o := Options{Dir: dir, Logger: testutil.Logger(t)}
	e := newExample(o)
	for label, rec := range map[string]record{
		"vm.0": {ID: "a", Complete: true},            // on: Resume must power it on, and cannot
		"vm.1": {ID: "b", Complete: true, Off: true}, // stopped by its user
		"vm.2": {ID: "c"},                            // its boot never finished
	} {
		if err := os.MkdirAll(filepath.Join(e.dir("st", label), "var/log/kloud"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := e.writeRecord("st", label, rec); err != nil {
			t.Fatal(err)
		}
	}
	console := filepath.Join(e.dir("st", "vm.0"), userdata.CloudInitOutputPath)
	if err := os.WriteFile(console, []byte(userdata.MarkerPrefix+"step=download status=start detail=\"http://kloud\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	n, err := Resume(t.Context(), o)
	if n != 0 || err == nil || !strings.Contains(err.Error(), "vm.0") || strings.Contains(err.Error(), "vm.1") || strings.Contains(err.Error(), "vm.2") {
		t.Fatalf("Resume: %d, %v; want vm.0's failure only", n, err)
	}
	m := &machine{e: e, b: &provider.BaseMachine{StackID: "st", Label: "vm.0"}}
	out, err := m.ConsoleLog(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	ms := userdata.ParseMarkers([]byte(out))
	if len(ms) != 2 || ms[1].Step != userdata.StepStartKlient || ms[1].Status != userdata.StatusFailed ||
		!strings.HasPrefix(ms[1].Detail, "the provider plugin restarted and the machine's agent did not come back: ") {
		t.Fatalf("console after a failed resume: %q, markers %+v", out, ms)
	}
	for _, l := range []string{"vm.1", "vm.2"} {
		m := &machine{e: e, b: &provider.BaseMachine{StackID: "st", Label: l}}
		if out, err := m.ConsoleLog(t.Context()); err != nil || out != "" {
			t.Fatalf("%s's console: %q %v; want it untouched", l, out, err)
		}
	}
}

// TestResumeProvisionsAgainWhenCut: provisioning runs on in the background after the boot, so
// a plugin killed after the boot can leave the agent's starter in place and provisioning cut
// (status start-klient ok, never done). Resume runs the machine's provisioning again from the
// start rather than only starting the agent, which would report a step that never ends (chaos
// plugin-apply: the build waited for it until the planner's timeout).
func TestResumeProvisionsAgainWhenCut(t *testing.T) {
	dir := t.TempDir()
	o := Options{Dir: dir, Logger: testutil.Logger(t)}
	e := newExample(o)
	m := e.dir("st", "vm.0")
	files := map[string]string{
		userdata.StartKlientPath:      "#!/bin/bash\nexit 1\n", // starting only the agent fails the test
		userdata.ProvisionStatusPath:  `{"step":"start-klient","status":"ok","detail":"","time":"2026-11-30T20:33:23Z"}`,
		"var/lib/cloud/user-data.txt": "touch \"$PWD/provisioned-again\"\n",
	}
	for name, content := range files {
		p := filepath.Join(m, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.writeRecord("st", "vm.0", record{ID: "a", Complete: true}); err != nil {
		t.Fatal(err)
	}
	if provisioned(m) {
		t.Fatal("provisioned: true for a status of start-klient")
	}
	n, err := Resume(t.Context(), o)
	if n != 1 || err != nil {
		t.Fatalf("Resume: %d, %v; want vm.0 powered on", n, err)
	}
	if _, err := os.Stat(filepath.Join(m, "provisioned-again")); err != nil {
		t.Fatalf("provisioning did not run again: %v", err)
	}
	os.WriteFile(filepath.Join(m, userdata.ProvisionStatusPath), []byte(`{"step":"done","status":"ok"}`), 0o644)
	if !provisioned(m) {
		t.Fatal("provisioned: false for a status of done")
	}
}
