package e2e

import (
	"os"
	"strconv"
	"testing"
)

// TestBrowserLive: the web UI updates itself from kloud's events (issue 22 §4), with `kloud
// serve` and a dummy machine (a real klient process). alice has the machines page and her
// stack's page open in Chromium; a third page of hers calls machine.stop and machine.start
// three times each; both pages show every change, and the script prints the time from kloud's
// write (the machine's updatedAt) to the page showing it, and from right before the call
// (e2e/browser/live.mjs; the median of write → DOM is asserted under 200 ms, 5 s under CI=true,
// KLOUD_LIVE_MAX_MEDIAN_MS overrides it). Then, with nothing changing for 15 s, the pages send
// no HTTP request and no WebSocket frame but pings. Screenshots in
// $KLOUD_ARTIFACTS/TestBrowserLive.
func TestBrowserLive(t *testing.T) {
	node, script, out := browserPrereqs(t)
	e := newEnv(t)
	password := browserUsers(t, e)
	e.aliceKey()
	tid := e.template(`
resource "terraform_data" "vm" {
  input = "#!/bin/bash\necho up"
}
`)
	sid := e.createStack(tid)
	e.apply(sid)
	m := e.machines(sid)["vm"]
	if m.State != "Running" {
		t.Fatalf("machine after the build: %+v", m)
	}
	// The target is 200 ms; under CI=true (the whole suite on 2 cores, load 15 to 40) the
	// assertion allows 5 s, and the real figure is printed either way: there it only says that
	// the pages follow kloud's events, not a poll (a poll is what the quiet step below rules
	// out). ci45 had medians of 1.0 s.
	maxMedian := 200
	if os.Getenv("CI") == "true" {
		maxMedian = 5000
	}
	if v, err := strconv.Atoi(os.Getenv("KLOUD_LIVE_MAX_MEDIAN_MS")); err == nil && v > 0 {
		maxMedian = v
	}
	runBrowserScript(t, e, node, script, out, "live.mjs", nil,
		"KLOUD_PASSWORD="+password, "KLOUD_MACHINE_ID="+m.ID, "KLOUD_STACK_ID="+sid,
		"KLOUD_CHANGES=3", "KLOUD_QUIET_MS=15000", "KLOUD_MAX_MEDIAN_MS="+strconv.Itoa(maxMedian))
}
