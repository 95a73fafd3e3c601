package kloud_test

import (
	"bufio"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/provider"
)

// Idle stop (issue 19 §5) with the dummy provider: its machines are real klient processes, the
// terminals real sessions through kloud, the stops real machine.stop jobs. Timeouts are seconds
// and the sweep runs every 100ms; the tests wait for what must happen (polling) and, for what
// must not, watch for several timeouts.

// idleOpts is kloud's idle stop for these tests: no timeout of kloud's own, a warning 2s before.
var idleOpts = kloudtest.Options{Idle: kloud.IdleOptions{Warning: 2 * time.Second, Interval: 100 * time.Millisecond}}

// info is machine.info of the env's machine as alice.
func (e *termEnv) info() api.MachineInfo {
	e.t.Helper()
	mi, err := e.client().MachineInfo(e.t.Context(), api.MachineRef{MachineID: e.machine.ID})
	if err != nil {
		e.t.Fatal(err)
	}
	return mi
}

// set is machine.set of the env's machine as alice.
func (e *termEnv) set(p api.MachineSetParams) model.Machine {
	e.t.Helper()
	p.MachineID = e.machine.ID
	m, err := e.client().MachineSet(e.t.Context(), p)
	if err != nil {
		e.t.Fatalf("machine.set %+v: %v", p, err)
	}
	return m
}

// stopJobs are the machine.stop jobs of the env's machine.
func (e *termEnv) stopJobs() []api.Job {
	e.t.Helper()
	res, err := e.client().JobList(e.t.Context(), api.JobListParams{Target: "machine/" + e.machine.ID})
	if err != nil {
		e.t.Fatal(err)
	}
	var out []api.Job
	for _, j := range res.Jobs {
		if j.Kind == "machine."+provider.MethodStop {
			out = append(out, j)
		}
	}
	return out
}

// waitState waits until the env's machine is in state.
func (e *termEnv) waitState(state provider.State, within time.Duration) api.MachineInfo {
	e.t.Helper()
	var mi api.MachineInfo
	testutil.Eventually(e.t, within, func() bool { mi = e.info(); return mi.State == state }, "machine never %s: %+v", state, &mi)
	return mi
}

// TestIdleStopWarnsThenStops: a template's idle timeout reaches its machine; the terminal
// attached to it hears the warning; nobody types, so the machine is stopped by a machine.stop
// job with the reason "idle for 4s", which machine.list shows; machine.start clears the reason
// and starts a new countdown. Another member can change neither the machine's settings nor
// the template's.
func TestIdleStopWarnsThenStops(t *testing.T) {
	t.Parallel()
	e := newTermEnvWith(t, idleOpts)
	ctx := t.Context()
	tmplID := e.describe(e.machine.StackID).TemplateID

	// A member of the team who does not own the machine or the template changes nothing, not
	// even with a full share of the machine; carol, who has no share, does not see it.
	addUsers(t, e.Env, false, "bob", "carol")
	if _, err := e.client().MachineShare(ctx, api.ShareParams{MachineID: e.machine.ID, Username: "bob", Grant: model.GrantFull}); err != nil {
		t.Fatal(err)
	}
	bob := e.Client("bob")
	if _, err := bob.MachineSet(ctx, api.MachineSetParams{MachineID: e.machine.ID, AlwaysOn: new(true)}); !errors.Is(err, kite.ErrPermission) {
		t.Fatalf("machine.set by bob (full share) on alice's machine: %v", err)
	}
	if _, err := e.Client("carol").MachineSet(ctx, api.MachineSetParams{MachineID: e.machine.ID, IdleTimeout: "0"}); !errors.Is(err, kite.ErrNotFound) {
		t.Fatalf("machine.set by carol on alice's machine: %v", err)
	}
	if _, err := bob.TemplateUpdate(ctx, api.TemplateParams{TemplateID: tmplID, IdleTimeout: "0"}); !errors.Is(err, kite.ErrPermission) {
		t.Fatalf("bob's template.update idleTimeout of alice's template: %v", err)
	}
	if mi := e.info(); mi.Idle.AlwaysOn != nil || mi.Idle.EffectiveTimeoutSeconds != 0 || !mi.Idle.Deadline.IsZero() {
		t.Fatalf("after bob's attempts (and with no timeout anywhere) the machine's idle stop is %+v", mi.Idle)
	}
	// Bad input is refused with a clear error.
	for _, bad := range []string{"soon", "-5m", "1.5s", "400d"} {
		if _, err := e.client().MachineSet(ctx, api.MachineSetParams{MachineID: e.machine.ID, IdleTimeout: bad}); !errors.Is(err, kite.ErrInvalidParams) || !strings.Contains(err.Error(), "idleTimeout") {
			t.Errorf("machine.set idleTimeout %q: %v", bad, err)
		}
	}

	// A template's always on reaches its machine; the machine's own choice wins over it.
	if tp, err := e.client().TemplateUpdate(ctx, api.TemplateParams{TemplateID: tmplID, AlwaysOn: new(true)}); err != nil || tp.Idle.AlwaysOn == nil || !*tp.Idle.AlwaysOn {
		t.Fatalf("template.update alwaysOn: %+v %v", tp.Idle, err)
	}
	if mi := e.info(); !mi.Idle.EffectiveAlwaysOn {
		t.Fatalf("the template's always on did not reach its machine: %+v", mi.Idle)
	}
	if m := e.set(api.MachineSetParams{AlwaysOn: new(false)}); m.Idle.EffectiveAlwaysOn {
		t.Fatalf("the machine's alwaysOn false did not win: %+v", m.Idle)
	}
	e.set(api.MachineSetParams{ResetAlwaysOn: true})
	if _, err := e.client().TemplateUpdate(ctx, api.TemplateParams{TemplateID: tmplID, AlwaysOn: new(false)}); err != nil {
		t.Fatal(err)
	}

	// The template says 4s; the machine inherits it and its countdown starts. The terminal is
	// attached first: set before the login, a slow login on a loaded host attached it after the
	// warning was sent (CI).
	cookie := e.login("alice", "alice-password")
	term := e.mustOpen(cookie, "session=idle")
	tp, err := e.client().TemplateUpdate(ctx, api.TemplateParams{TemplateID: tmplID, IdleTimeout: "4s"})
	if err != nil || tp.Idle.TimeoutSeconds == nil || *tp.Idle.TimeoutSeconds != 4 {
		t.Fatalf("template.update idleTimeout 4s: %+v %v", tp.Idle, err)
	}
	term.WaitFor(t, "will be stopped in")
	if !strings.Contains(term.Output(), "[kloud] machine "+e.machine.Label+" has been idle for") {
		t.Errorf("warning: %q", term.Output())
	}

	mi := e.waitState(provider.Stopped, time.Minute)
	if mi.Reason != kloud.IdleReasonPrefix+"4s" {
		t.Fatalf("reason of the idle stop: %q", mi.Reason)
	}
	// The machine is Stopped a moment before its job is finished.
	var jobs []api.Job
	testutil.Eventually(t, time.Minute, func() bool {
		jobs = e.stopJobs()
		return len(jobs) != 1 || jobs[0].Status.Done()
	}, "the idle stop job did not end")
	if len(jobs) != 1 || jobs[0].Status != "succeeded" || jobs[0].Owner != "alice" || jobs[0].Params["reason"] != "idle for 4s" {
		t.Fatalf("stop jobs: %+v", jobs)
	}
	if c := term.Closed(t); c.Code != websocket.StatusGoingAway && c.Code != 4004 {
		t.Errorf("the terminal of the stopped machine closed with %+v", c)
	}
	list, err := e.client().MachineList(ctx, api.MachineListParams{StackID: e.machine.StackID})
	if err != nil || len(list.Machines) != 1 || list.Machines[0].Reason != "idle for 4s" || list.Machines[0].Idle.EffectiveTimeoutSeconds != 4 {
		t.Fatalf("machine.list after the idle stop: %+v %v", list.Machines, err)
	}

	// Start clears the reason and starts a new countdown (not the old, past deadline).
	before := time.Now().Add(-time.Second)
	ref, err := e.client().MachineStart(ctx, api.MachineRef{MachineID: e.machine.ID})
	if err != nil {
		t.Fatal(err)
	}
	e.mustSucceed(ref.JobID, "machine.start")
	mi = e.info()
	if mi.State != provider.Running || mi.Reason != "" {
		t.Fatalf("after start: %s %q", mi.State, mi.Reason)
	}
	if mi.Idle.LastActivity.Before(before) {
		t.Fatalf("the countdown did not restart at start: %+v", mi.Idle)
	}
	// And the new countdown ends in a second idle stop.
	e.waitState(provider.Stopped, time.Minute)
	if n := len(e.stopJobs()); n != 2 {
		t.Fatalf("%d stop jobs, want 2", n)
	}
}

// TestIdleTypingAndAlwaysOnKeepTheMachine: a machine whose terminal is typed into is never
// stopped, nor an always-on one; when the typing ends, or always on is undone, it is.
func TestIdleTypingAndAlwaysOnKeepTheMachine(t *testing.T) {
	t.Parallel()
	e := newTermEnvWith(t, idleOpts)
	// The timeout is set once the terminal is open: set before the login, a login slower than
	// the timeout on a loaded host let the machine be stopped before the typing began (CI).
	cookie := e.login("alice", "alice-password")
	term := e.mustOpen(cookie, "session=typing")
	m := e.set(api.MachineSetParams{IdleTimeout: "6s"})
	if m.Idle.TimeoutSeconds == nil || *m.Idle.TimeoutSeconds != 6 || m.Idle.EffectiveTimeoutSeconds != 6 {
		t.Fatalf("machine.set idleTimeout 6s: %+v", m.Idle)
	}

	// Type for two timeouts: the machine stays Running and no stop job is started. The timeout
	// is 6s, not the 3s of the other tests: on a loaded host the calls between the last
	// keystroke and always on taking effect took longer than 3s, and the machine was (rightly)
	// stopped for it.
	for end := time.Now().Add(12 * time.Second); time.Now().Before(end); {
		term.Type(t, "true\r")
		time.Sleep(300 * time.Millisecond) // a person typing, not a synchronisation
	}
	if mi := e.info(); mi.State != provider.Running || len(e.stopJobs()) != 0 {
		t.Fatalf("a machine being typed into: %s, stop jobs %+v", mi.State, e.stopJobs())
	}

	// Always on: idle for two timeouts, still Running, and no countdown.
	m = e.set(api.MachineSetParams{AlwaysOn: new(true)})
	if !m.Idle.EffectiveAlwaysOn {
		t.Fatalf("always on: %+v", m.Idle)
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return e.info().Idle.Deadline.IsZero() }, "an always-on machine kept its countdown")
	deadline := time.Now().Add(12 * time.Second)
	for time.Now().Before(deadline) {
		if mi := e.info(); mi.State != provider.Running {
			t.Fatalf("an always-on machine was stopped: %s %q", mi.State, mi.Reason)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if n := len(e.stopJobs()); n != 0 {
		t.Fatalf("%d stop jobs of an always-on machine", n)
	}

	// Undone, and nobody typing: the machine is stopped for being idle.
	e.set(api.MachineSetParams{AlwaysOn: new(false)})
	if mi := e.waitState(provider.Stopped, time.Minute); mi.Reason != "idle for 6s" {
		t.Fatalf("reason: %q", mi.Reason)
	}
}

// TestIdleCountdownSurvivesRestart: kloud stops between the countdown's start and its
// deadline; the kloud started on the same store keeps the recorded deadline (no fresh timeout)
// and stops the machine for it.
func TestIdleCountdownSurvivesRestart(t *testing.T) {
	t.Parallel()
	ko := idleOpts
	ko.DataDir, ko.Addr = t.TempDir(), fmt.Sprintf("127.0.0.1:%d", freePort(t))
	e := newTermEnvWith(t, ko)
	e.set(api.MachineSetParams{IdleTimeout: "20s"})
	var deadline time.Time
	testutil.Eventually(t, 10*time.Second, func() bool { deadline = e.info().Idle.Deadline; return !deadline.IsZero() }, "no countdown")

	e.Stop()
	time.Sleep(2 * time.Second) // kloud is down for a while: a fresh timeout would end later
	ko.Providers, ko.KlientBin = e.Server.Providers(), testutil.BuildBinary(t, "./cmd/klient")
	e2 := kloudtest.Start(t, ko)
	f2 := &flowEnv{Env: e2, t: t, dir: e.dir, alice: e2.Dial("alice")}
	e.flowEnv = f2
	// (Unless a slow restart let the new kloud stop it already: the stop job's deadline is
	// checked below either way.)
	if mi := e.info(); mi.State == provider.Running && !mi.Idle.Deadline.Equal(deadline) {
		t.Fatalf("after the restart: deadline %s, want %s", mi.Idle.Deadline, deadline)
	}
	mi := e.waitState(provider.Stopped, time.Minute)
	if mi.Reason != "idle for 20s" {
		t.Fatalf("reason: %q", mi.Reason)
	}
	jobs := e.stopJobs()
	if len(jobs) != 1 {
		t.Fatalf("stop jobs: %+v", jobs)
	}
	if got, _ := time.Parse(time.RFC3339Nano, jobs[0].Params["idleDeadline"].(string)); !got.Equal(deadline) {
		t.Fatalf("the stop was for deadline %s, want the one recorded before the restart, %s", got, deadline)
	}
}

// TestIdleCPUKeepsTheMachine: a busy process left running in a detached terminal is activity
// (the machine's klient reports its CPU time, klient.activity); when it ends, the machine is
// stopped for being idle.
func TestIdleCPUKeepsTheMachine(t *testing.T) {
	t.Parallel()
	ko := idleOpts
	ko.Idle.CPUInterval = 500 * time.Millisecond
	// A busy loop gets a few percent of a CPU on a host loaded thirty times over (CI); an idle
	// session's processes get none.
	ko.Idle.CPUThreshold = 0.01
	e := newTermEnvWith(t, ko)
	cookie := e.login("alice", "alice-password")
	term := e.mustOpen(cookie, "session=build")
	// A bounded busy loop (a build), in the background of the session's shell; the terminal
	// is closed, the session lives on. The timeout is set once the loop runs and while the
	// terminal is open (an open terminal is activity): set before the login, a slow login on a
	// loaded host let the idle machine be stopped before the loop began (CI).
	// The idle timeout is 8s, not the 3s of the other tests: each CPU reading is a call to the
	// agent, and on a loaded host (CI) no reading came back within 3s, so the busy machine
	// was stopped.
	busyUntil := time.Now().Add(16 * time.Second) // the loop ends no earlier
	term.Type(t, "timeout 16 sh -c 'while :; do :; done' & echo busy-$((2*21))\r")
	term.WaitFor(t, "busy-42")
	e.set(api.MachineSetParams{IdleTimeout: "8s"})
	term.WS.Close(websocket.StatusNormalClosure, "")

	for time.Now().Before(busyUntil.Add(-2 * time.Second)) {
		if mi := e.info(); mi.State != provider.Running {
			t.Fatalf("a machine whose processes are busy was stopped: %s %q", mi.State, mi.Reason)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if n := len(e.stopJobs()); n != 0 {
		t.Fatalf("%d stop jobs while the machine was busy", n)
	}
	if mi := e.waitState(provider.Stopped, time.Minute); mi.Reason != "idle for 8s" {
		t.Fatalf("reason: %q", mi.Reason)
	}
}

// TestIdlePortForwardKeepsTheMachine: traffic through a `kloud port-forward` tunnel to a
// machine's port is activity: the machine stays Running while bytes flow for four timeouts;
// once the tunnel is closed, it is stopped for being idle.
func TestIdlePortForwardKeepsTheMachine(t *testing.T) {
	t.Parallel()
	e := newTermEnvWith(t, idleOpts)
	// An echo server "in the machine" (the dummy machine's loopback is this host's).
	port := echoServer(t)
	cookie := e.login("alice", "alice-password")
	// 6 s, not 3: on a host loaded forty times over (CI), 3 s of idleness passed between the
	// tunnel's pings and the machine was stopped under the test's traffic.
	e.set(api.MachineSetParams{IdleTimeout: "6s"})
	tun := dialTunnel(t, e.URL, e.machine.ID, port, cookie)
	r := bufio.NewReader(tun)
	for end := time.Now().Add(24 * time.Second); time.Now().Before(end); {
		fmt.Fprintf(tun, "ping\n")
		if line, err := r.ReadString('\n'); err != nil || line != "ping\n" {
			t.Fatalf("through the tunnel: %q %v", line, err)
		}
		time.Sleep(300 * time.Millisecond) // a client's traffic, not a synchronisation
	}
	if mi := e.info(); mi.State != provider.Running || len(e.stopJobs()) != 0 {
		t.Fatalf("a machine with port-forward traffic: %s, stop jobs %+v", mi.State, e.stopJobs())
	}
	tun.Close()
	if mi := e.waitState(provider.Stopped, time.Minute); mi.Reason != "idle for 6s" {
		t.Fatalf("reason: %q", mi.Reason)
	}
}

// TestAutostart: a machine's start schedule starts it when it is Stopped, through a
// machine.start job, and moves its next start to the next day; bad schedules and time zones
// are refused saying what to give.
func TestAutostart(t *testing.T) {
	t.Parallel()
	e := newTermEnvWith(t, idleOpts)
	ctx := t.Context()
	for _, bad := range []api.MachineSetParams{{Autostart: "daily 25:00"}, {Autostart: "someday 09:00"}, {Autostart: "mon-fri"},
		{Autostart: "daily 09:00", Timezone: "Mars/Olympus"}, {Timezone: "UTC", IdleTimeout: "1h"}} {
		bad.MachineID = e.machine.ID
		if _, err := e.client().MachineSet(ctx, bad); !errors.Is(err, kite.ErrInvalidParams) {
			t.Errorf("machine.set %+v: %v", bad, err)
		}
	}
	ref, err := e.client().MachineStop(ctx, api.MachineRef{MachineID: e.machine.ID})
	if err != nil {
		t.Fatal(err)
	}
	e.mustSucceed(ref.JobID, "machine.stop")

	// The next whole minute that is at least 20s away, in Berlin's time.
	loc, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	at := time.Now().Add(20 * time.Second).Truncate(time.Minute).Add(time.Minute).In(loc)
	m := e.set(api.MachineSetParams{Autostart: "daily " + at.Format("15:04"), Timezone: "Europe/Berlin"})
	if m.Autostart == nil || !m.Autostart.Next.Equal(at) || m.Autostart.TZ != "Europe/Berlin" {
		t.Fatalf("autostart %s: %+v", at, m.Autostart)
	}
	mi := e.waitState(provider.Running, 3*time.Minute)
	if mi.Autostart == nil || !mi.Autostart.Next.Equal(at.AddDate(0, 0, 1)) {
		t.Fatalf("after the autostart, the next start is %+v, want %s", mi.Autostart, at.AddDate(0, 0, 1))
	}
	res, err := e.client().JobList(ctx, api.JobListParams{Target: "machine/" + e.machine.ID})
	if err != nil {
		t.Fatal(err)
	}
	starts := 0
	for _, j := range res.Jobs {
		if j.Kind == "machine."+provider.MethodStart && j.Owner == "alice" && j.Status == "succeeded" {
			starts++
		}
	}
	if starts != 1 {
		t.Fatalf("%d start jobs: %+v", starts, res.Jobs)
	}
	if m := e.set(api.MachineSetParams{Autostart: api.AutostartOff}); m.Autostart != nil {
		t.Fatalf("autostart off: %+v", m.Autostart)
	}
}

// TestIdleReadonlyTypingDoesNotCount: the keys of a read-only viewer, which klient drops, are
// no activity: the machine is stopped while bob, watching alice's session, types.
func TestIdleReadonlyTypingDoesNotCount(t *testing.T) {
	t.Parallel()
	e := newTermEnvWith(t, idleOpts)
	addUsers(t, e.Env, true, "bob")
	share(t, e, "bob", model.GrantReadonly)
	cookie, bobCookie := e.login("alice", "alice-password"), e.login("bob", "bob-password")
	owner := e.mustOpen(cookie, "session=pair")
	owner.Type(t, "echo first-$((1+2))\r")
	owner.WaitFor(t, "first-3")
	owner.WS.Close(websocket.StatusNormalClosure, "")
	bob := e.mustOpen(bobCookie, "session=pair") // read-only
	bob.WaitFor(t, "first-3")
	e.set(api.MachineSetParams{IdleTimeout: "3s"})
	var mi api.MachineInfo
	for end := time.Now().Add(time.Minute); time.Now().Before(end); time.Sleep(300 * time.Millisecond) {
		bob.WS.Write(t.Context(), websocket.MessageBinary, []byte("\x00true\r")) // input; fails once the machine is gone
		if mi = e.info(); mi.State != provider.Running {
			break
		}
	}
	if mi.State == provider.Running {
		t.Fatal("a machine whose only input was a read-only viewer's was not stopped in a minute (20 timeouts)")
	}
	if mi = e.waitState(provider.Stopped, time.Minute); mi.Reason != "idle for 3s" {
		t.Fatalf("reason: %q", mi.Reason)
	}
}
