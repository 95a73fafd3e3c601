package e2e

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
)

// TestIdleStop is the idle stop (issue 19 §5) as a user meets it, through the CLI and the web
// UI, with `kloud serve` and a dummy machine (a real klient process): a template's idle
// timeout reaches its machine (`kloud machine list` counts down), a bad duration is refused
// saying what to give, `kloud machine set` shortens the machine's own timeout, kloud stops the
// machine, and `kloud machine list`, `machine info` and the web UI (Chromium: the machines page
// and the machine's page, with its autostart schedule) say "stopped: idle for 5s"; `machine set
// --idle-timeout 0` and a start
// bring it back with the reason cleared and no countdown. Screenshots in
// $KLOUD_ARTIFACTS/TestIdleStop.
func TestIdleStop(t *testing.T) {
	node, script, out := browserPrereqs(t)
	e := newEnv(t, "--idle-warning", "2s")
	password := browserUsers(t, e)
	key := filepath.Join(e.dir, "alice.key")
	e.run("key", "create", "--username", "alice", "--out", key)
	e.key = key
	e.run("credential", "add", "--provider", "dummy", "--title", "mine", "--field", "token=abc123")
	tid := e.template(`
resource "terraform_data" "vm" {
  input = "#!/bin/bash\necho up"
}
`)
	sid := e.createStack(tid)
	e.apply(sid)

	if got := e.run("template", "update", tid, "--idle-timeout", "1h"); !strings.Contains(got, "idle stop of its machines: stopped after 1h idle") {
		t.Fatalf("template update --idle-timeout 1h:\n%s", got)
	}
	testutil.Eventually(t, time.Minute, func() bool {
		return strings.Contains(e.run("machine", "list", "--stack", sid), "idle stop in ")
	}, "machine list never showed the countdown:\n%s", e.run("machine", "list", "--stack", sid))

	got, err := e.try("machine", "set", "vm", "--stack", sid, "--idle-timeout", "soon")
	if err == nil || !strings.Contains(got, "idleTimeout \"soon\": want a duration such as 30m") {
		t.Fatalf("machine set --idle-timeout soon: %v\n%s", err, got)
	}
	if got, err := e.try("machine", "set", "vm", "--stack", sid); err == nil || !strings.Contains(got, "say what to change") {
		t.Fatalf("machine set without a setting: %v\n%s", err, got)
	}
	var m struct {
		ID   string
		Idle struct {
			TimeoutSeconds          *int64
			EffectiveTimeoutSeconds int64
		}
	}
	if err := json.Unmarshal([]byte(e.run("machine", "set", "vm", "--stack", sid, "--idle-timeout", "5s", "--json")), &m); err != nil {
		t.Fatal(err)
	}
	if m.Idle.TimeoutSeconds == nil || *m.Idle.TimeoutSeconds != 5 || m.Idle.EffectiveTimeoutSeconds != 5 {
		t.Fatalf("machine set --idle-timeout 5s --json: %+v", m.Idle)
	}

	// kloud's sweep runs every 15s: the stop comes within 5s + 15s or so.
	const want = "stopped: idle for 5s"
	testutil.Eventually(t, 2*time.Minute, func() bool {
		return strings.Contains(e.run("machine", "list", "--stack", sid), want)
	}, "machine list never said %q:\n%s", want, e.run("machine", "list", "--stack", sid))
	if info := e.run("machine", "info", "vm", "--stack", sid); !strings.Contains(info, "idle:   "+want) || !strings.Contains(info, "reason: idle for 5s") {
		t.Fatalf("machine info:\n%s", info)
	}

	// An autostart schedule, in the CLI and on the machine's page.
	if got := e.run("machine", "set", "vm", "--stack", sid, "--autostart", "daily 06:00", "--timezone", "Europe/Berlin"); !strings.Contains(got, "autostart: daily 06:00 Europe/Berlin (next start ") {
		t.Fatalf("machine set --autostart:\n%s", got)
	}
	if got, err := e.try("machine", "set", "vm", "--stack", sid, "--autostart", "daily 6pm"); err == nil || !strings.Contains(got, "is not HH:MM") {
		t.Fatalf("machine set --autostart 'daily 6pm': %v\n%s", err, got)
	}

	runBrowserScript(t, e, node, script, out, "idle.mjs", nil,
		"KLOUD_PASSWORD="+password, "KLOUD_MACHINE_ID="+m.ID, "KLOUD_IDLE_TEXT="+want, "KLOUD_AUTOSTART_TEXT=daily 06:00 Europe/Berlin")
	e.run("machine", "set", "vm", "--stack", sid, "--autostart", "off")

	e.run("machine", "set", "vm", "--stack", sid, "--idle-timeout", "0")
	e.run("machine", "start", "vm", "--stack", sid)
	list := e.run("machine", "list", "--stack", sid)
	if ms := e.machines(sid); ms["vm"].State != "Running" || ms["vm"].Reason != "" || !strings.Contains(list, "never stopped") {
		t.Fatalf("after set --idle-timeout 0 and start: %+v\n%s", ms["vm"], list)
	}
}
