// Package idle is kloud's idle stop and autostart engine (issue 19 §5): kloud stops a Running
// machine nobody uses, as Koding did after 50 minutes, and starts a Stopped machine at the time
// its schedule names.
//
// A machine's settings are its own (machine.set), else its stack's template's (template.update
// idleTimeout, alwaysOn), else kloud's (Settings.Timeout, kloud serve --idle-timeout; default 0:
// never).
//
// Activity is what kloud relays: a terminal attached or typed into (web terminals and `kloud
// ssh`; read-only viewers' keys do not count), port-forward connections and their traffic,
// web-app requests (kloud/relay reports them through [Tracker.Touch]); and what the machine's
// agent reports (klient.activity, polled every CPUInterval while a countdown runs): its terminal
// sessions' processes using more than CPUThreshold of one CPU between two readings, e.g. a build
// left running in a detached terminal. It is noted in memory at once (Touch) and written to the
// machine at most once per sweep (Machine.Idle.LastActivity, and the deadline: last activity +
// timeout), so a kloud restart neither loses nor resets a countdown. The sweep ([Tracker.Run], a
// background task) warns the machine's attached terminals a while before the deadline and, at
// the deadline, stops the machine through the durable machine.stop job with the reason "idle for
// <timeout>" (machine.list and machine.info show it; machine.start clears it and restarts the
// countdown). Activity noted up to the moment the job stops the provider's machine cancels the
// stop ([Tracker.StillDue]): a machine being typed into is never stopped.
//
// Autostart (machine.set autostart): a machine's schedule ("mon-fri 09:00" in a time zone) and
// its next start are in the machine document; at that time the sweep starts the machine with
// the machine.start job if it is Stopped, and moves the next start on either way.
//
// The package never imports kloud: it gets what it needs through the small interfaces of
// [Options] (kloud/idle.go is the adapter).
package idle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/kloud-dev/kloud/klient/klientapi"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/provider"
)

// Defaults of [Settings].
const (
	// KodingTimeout is what Koding used; kloud's default is off (0).
	KodingTimeout = 50 * time.Minute
	// DefaultWarning is how long before an idle stop attached terminals are warned.
	DefaultWarning = 5 * time.Minute
	// DefaultInterval is how often kloud looks for idle machines and writes activity.
	DefaultInterval = 15 * time.Second
	// DefaultCPUThreshold is the share of one CPU above which a machine's processes count
	// as activity, and DefaultCPUInterval how often kloud asks the agent.
	DefaultCPUThreshold = 0.1
	DefaultCPUInterval  = time.Minute
)

// ReasonPrefix starts the reason of a machine kloud stopped for being idle.
const ReasonPrefix = "idle for "

// ErrBusy is what [Power] reports (wrapped) when a job holds the machine or it is no longer in
// the state the job wants: the sweep leaves it alone.
var ErrBusy = errors.New("idle: machine busy")

// Settings configure the idle stop (kloud.Options.Idle).
type Settings struct {
	// Timeout is kloud's idle timeout, for machines whose template and own settings say
	// nothing (kloud serve --idle-timeout); 0 (the default): never.
	Timeout time.Duration
	// Warning is how long before the stop attached terminals get a warning line (kloud serve
	// --idle-warning; default DefaultWarning; at most half the machine's timeout).
	Warning time.Duration
	// Interval is how often kloud looks for idle machines and writes the activity it saw
	// (default DefaultInterval): the countdown's resolution, and the throttle of activity
	// writes (one per machine per interval at most).
	Interval time.Duration
	// CPUThreshold is the share of one CPU (0.1: 10%) the processes of a machine's terminal
	// sessions must use between two readings of its agent to count as activity (kloud serve
	// --idle-cpu-threshold; default DefaultCPUThreshold; negative: CPU never counts).
	CPUThreshold float64
	// CPUInterval is how often kloud reads the CPU of a machine with a countdown from its agent
	// (default DefaultCPUInterval).
	CPUInterval time.Duration
}

// Defaults checks s and fills in its zero fields.
func (o *Settings) Defaults() error {
	if o.Timeout < 0 || o.Timeout > api.MaxIdleTimeout {
		return fmt.Errorf("kloud: --idle-timeout %s: want 0 (never) up to %s", o.Timeout, api.MaxIdleTimeout)
	}
	if o.Warning <= 0 {
		o.Warning = DefaultWarning
	}
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	if o.CPUThreshold == 0 {
		o.CPUThreshold = DefaultCPUThreshold
	}
	if o.CPUInterval <= 0 {
		o.CPUInterval = DefaultCPUInterval
	}
	return nil
}

// Options configure a Tracker. Machines, Templates, Power, Notices and Agents are required.
type Options struct {
	Settings Settings // checked and defaulted by New

	Machines  Machines  // the machines' idle and autostart fields (kloud/store's Machines)
	Templates Templates // the templates of machines' stacks
	Power     Power     // the machine.stop and machine.start jobs
	Notices   Notices   // lines to a machine's attached terminals (kloud/relay's Hub)
	Agents    Agents    // machines' klients

	Now    func() time.Time // the store's clock (activity and countdowns); nil: time.Now
	Logger *slog.Logger     // nil: discard
}

// Machines is the part of kloud's machines repository the idle stop reads and writes.
type Machines interface {
	// InStates lists the machines in one of states.
	InStates(ctx context.Context, states []string) ([]model.Machine, error)
	// SetIdleCountdown writes machine id's last activity and deadline if it is in state and
	// has no newer activity (false: it is not, or it has).
	SetIdleCountdown(ctx context.Context, id, state string, lastActivity, deadline time.Time) (bool, error)
	// ResetIdleCountdown makes at machine id's last activity and drops its deadline.
	ResetIdleCountdown(ctx context.Context, id string, at time.Time) error
	// AutostartDue lists the machines whose next scheduled start is not after now.
	AutostartDue(ctx context.Context, now time.Time) ([]model.Machine, error)
	// SetAutostart sets (nil: drops) machine id's schedule.
	SetAutostart(ctx context.Context, id string, a *model.Autostart) error
	// SetAutostartNext moves machine id's next start from prev to next (false: another kloud
	// moved it first).
	SetAutostartNext(ctx context.Context, id string, prev, next time.Time) (bool, error)
}

// Templates looks up the template of a stack.
type Templates interface {
	// StackTemplate is the template of stack id (nil: the stack or its template is gone).
	StackTemplate(ctx context.Context, stackID string) *model.Template
}

// Power starts the durable jobs that stop and start machines.
type Power interface {
	// CanStop reports whether the provider named can stop (and so idle-stop) machines.
	CanStop(provider string) bool
	// Stop starts m's machine.stop job on behalf of its owner, with the reason and the
	// countdown it acts on (the job calls StillDue with them before it stops the machine). An
	// error wrapping ErrBusy: a job holds m, or it is no longer Running.
	Stop(ctx context.Context, m *model.Machine, s Stop) error
	// Start starts m's machine.start job on behalf of its owner.
	Start(ctx context.Context, m *model.Machine) error
}

// Stop is an idle stop the sweep decided.
type Stop struct {
	Reason   string        // ReasonPrefix + the timeout
	Deadline time.Time     // the countdown's end
	Timeout  time.Duration // the machine's timeout
}

// Notices writes a line to the terminals attached to a machine.
type Notices interface {
	// Notice writes text to machine id's attached terminals and says how many it reached.
	Notice(id, text string) int
}

// Agents reaches machines' klients.
type Agents interface {
	// Agent is the connection of m's agent now (an error when it has none).
	Agent(ctx context.Context, m *model.Machine) (Agent, error)
}

// Agent calls a machine's klient (a *kite.Conn).
type Agent interface {
	Call(ctx context.Context, method string, params, result any) error
}

// Tracker is the idle stop: what this kloud saw of its machines' activity since it last wrote
// it, the countdowns whose terminals it warned, and the sweep.
type Tracker struct {
	o   Options
	log *slog.Logger

	mu     sync.Mutex
	last   map[string]time.Time // machine id → latest activity seen
	warned map[string]time.Time // machine id → the deadline its terminals were warned of
	cpu    map[string]*cpuSample
}

// cpuSample is the last reading of a machine's agent (klient.activity).
type cpuSample struct {
	seconds float64   // klientapi.Activity.CPUSeconds
	at      time.Time // when kloud read it (zero: never)
	asked   time.Time // when kloud last asked
	polling bool      // a call is under way
}

// New checks o and returns its Tracker.
func New(o Options) (*Tracker, error) {
	if o.Machines == nil || o.Templates == nil || o.Power == nil || o.Notices == nil || o.Agents == nil {
		return nil, errors.New("idle: Machines, Templates, Power, Notices and Agents are required")
	}
	if err := o.Settings.Defaults(); err != nil {
		return nil, err
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Tracker{o: o, log: log, last: map[string]time.Time{}, warned: map[string]time.Time{}, cpu: map[string]*cpuSample{}}, nil
}

// Touch notes activity on machine id now.
func (t *Tracker) Touch(id string) {
	now := t.o.Now()
	t.mu.Lock()
	if now.After(t.last[id]) {
		t.last[id] = now
	}
	t.mu.Unlock()
}

// lastActivity is the latest activity this kloud saw on machine id (zero: none).
func (t *Tracker) lastActivity(id string) time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.last[id]
}

// forget drops what the tracker holds of machines not in keep.
func (t *Tracker) forget(keep map[string]bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for id := range t.last {
		if !keep[id] {
			delete(t.last, id)
		}
	}
	for id := range t.warned {
		if !keep[id] {
			delete(t.warned, id)
		}
	}
	for id := range t.cpu {
		if !keep[id] {
			delete(t.cpu, id)
		}
	}
}

// warnOnce reports whether the terminals of machine id are still to be warned of deadline (and
// marks them warned).
func (t *Tracker) warnOnce(id string, deadline time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.warned[id].Equal(deadline) {
		return false
	}
	t.warned[id] = deadline
	return true
}

// settings are machine m's settings in force: its own, else its template's (tpl, nil when
// gone), else kloud's; no timeout when m's provider cannot stop machines.
func (t *Tracker) settings(m *model.Machine, tpl *model.Template) (timeout time.Duration, alwaysOn bool) {
	timeout = t.o.Settings.Timeout
	if tpl != nil {
		if tpl.Idle.TimeoutSeconds != nil {
			timeout = time.Duration(*tpl.Idle.TimeoutSeconds) * time.Second
		}
		if tpl.Idle.AlwaysOn != nil {
			alwaysOn = *tpl.Idle.AlwaysOn
		}
	}
	if m.Idle.TimeoutSeconds != nil {
		timeout = time.Duration(*m.Idle.TimeoutSeconds) * time.Second
	}
	if m.Idle.AlwaysOn != nil {
		alwaysOn = *m.Idle.AlwaysOn
	}
	if !t.o.Power.CanStop(m.Provider) {
		timeout = 0 // its provider cannot stop it
	}
	return timeout, alwaysOn
}

// templatesOf looks up the templates of machines' stacks, once per stack.
type templatesOf struct {
	t       Templates
	byStack map[string]*model.Template
}

func (t *Tracker) templatesOf() *templatesOf {
	return &templatesOf{t: t.o.Templates, byStack: map[string]*model.Template{}}
}

func (tc *templatesOf) of(ctx context.Context, m *model.Machine) *model.Template {
	if t, ok := tc.byStack[m.StackID]; ok {
		return t
	}
	t := tc.t.StackTemplate(ctx, m.StackID)
	tc.byStack[m.StackID] = t
	return t
}

// Show fills in the idle settings in force of ms (machine.list, machine.info).
func (t *Tracker) Show(ctx context.Context, ms []model.Machine) {
	tc := t.templatesOf()
	for i := range ms {
		timeout, always := t.settings(&ms[i], tc.of(ctx, &ms[i]))
		ms[i].Idle.EffectiveTimeoutSeconds, ms[i].Idle.EffectiveAlwaysOn = int64(timeout/time.Second), always
		if always || timeout == 0 || ms[i].State != provider.Running {
			ms[i].Idle.Deadline = time.Time{} // a countdown not in force (the sweep clears it)
		}
	}
}

// Run is the idle stop's background task: a sweep every interval until ctx ends.
func (t *Tracker) Run(ctx context.Context) {
	tk := time.NewTicker(t.o.Settings.Interval)
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tk.C:
			if err := t.sweep(ctx); err != nil && ctx.Err() == nil {
				t.log.Warn("idle stop: sweep", "err", err)
			}
		}
	}
}

// sweep writes the activity seen, warns and stops the Running machines that are idle.
func (t *Tracker) sweep(ctx context.Context) error {
	ms, err := t.o.Machines.InStates(ctx, []string{string(provider.Running)})
	if err != nil {
		return err
	}
	tc := t.templatesOf()
	keep := map[string]bool{}
	for i := range ms {
		m := &ms[i]
		keep[m.ID] = true
		timeout, always := t.settings(m, tc.of(ctx, m))
		if err := t.check(ctx, m, timeout, always); err != nil {
			t.log.Warn("idle stop", "machine", m.ID, "err", err)
		}
	}
	t.forget(keep)
	return t.autostartSweep(ctx)
}

// autostartSweep starts the Stopped machines whose scheduled start is due, and schedules the
// next start of every due machine.
func (t *Tracker) autostartSweep(ctx context.Context) error {
	now := t.o.Now()
	due, err := t.o.Machines.AutostartDue(ctx, now)
	if err != nil {
		return err
	}
	for i := range due {
		m := &due[i]
		sc, loc, err := api.ParseAutostart(m.Autostart.Schedule, m.Autostart.TZ)
		if err != nil {
			t.log.Warn("autostart: a schedule kloud cannot read; dropped", "machine", m.ID, "err", err)
			if err := t.o.Machines.SetAutostart(ctx, m.ID, nil); err != nil {
				return err
			}
			continue
		}
		ok, err := t.o.Machines.SetAutostartNext(ctx, m.ID, m.Autostart.Next, sc.Next(now, loc))
		if err != nil || !ok {
			continue // another kloud took it
		}
		if m.State != provider.Stopped {
			continue // running already, or busy: the next start is the next one
		}
		if err := t.o.Power.Start(ctx, m); err != nil {
			t.log.Warn("autostart: start", "machine", m.ID, "err", err)
			continue
		}
		t.log.Info("autostart: starting", "machine", m.ID, "schedule", m.Autostart.Schedule, "tz", m.Autostart.TZ)
	}
	return nil
}

// check is the sweep of one Running machine.
func (t *Tracker) check(ctx context.Context, m *model.Machine, timeout time.Duration, always bool) error {
	now := t.o.Now()
	if always || timeout <= 0 {
		if !m.Idle.Deadline.IsZero() { // no countdown any more
			_, err := t.o.Machines.SetIdleCountdown(ctx, m.ID, string(provider.Running), m.Idle.LastActivity, time.Time{})
			return err
		}
		return nil
	}
	base := m.Idle.LastActivity
	if m.Idle.Deadline.IsZero() && base.Before(now) {
		base = now // a countdown starts (the machine got a timeout, or its settings changed)
	}
	if seen := t.lastActivity(m.ID); seen.After(base) {
		base = seen
	}
	deadline := base.Add(timeout)
	if !base.Equal(m.Idle.LastActivity) || !deadline.Equal(m.Idle.Deadline) {
		ok, err := t.o.Machines.SetIdleCountdown(ctx, m.ID, string(provider.Running), base, deadline)
		if err != nil || !ok {
			return err // not Running any more, or another kloud wrote newer activity
		}
	}
	t.pollCPU(ctx, m)
	warnAt := deadline.Add(-min(t.o.Settings.Warning, timeout/2))
	switch {
	case !now.Before(deadline):
		return t.stop(ctx, m, timeout, deadline)
	case !now.Before(warnAt) && t.warnOnce(m.ID, deadline):
		n := t.o.Notices.Notice(m.ID, fmt.Sprintf("\r\n[kloud] machine %s has been idle for %s and will be stopped in %s (at %s UTC); type anything to keep it running.\r\n",
			m.Label, ShortDuration(now.Sub(base)), ShortDuration(deadline.Sub(now)), deadline.UTC().Format("15:04:05")))
		t.log.Info("idle stop: warned", "machine", m.ID, "deadline", deadline, "terminals", n)
	}
	return nil
}

// pollCPU asks m's agent for its CPU time, at most every CPUInterval and one call at a time,
// in the background; CPU use above the threshold since the last reading is activity.
func (t *Tracker) pollCPU(ctx context.Context, m *model.Machine) {
	o := t.o.Settings
	if o.CPUThreshold < 0 || m.KiteID == "" {
		return
	}
	now := time.Now()
	t.mu.Lock()
	cs := t.cpu[m.ID]
	if cs == nil {
		cs = &cpuSample{}
		t.cpu[m.ID] = cs
	}
	due := !cs.polling && now.Sub(cs.asked) >= o.CPUInterval
	if due {
		cs.polling, cs.asked = true, now
	}
	t.mu.Unlock()
	if !due {
		return
	}
	go func() {
		var act klientapi.Activity
		err := errors.New("no agent")
		if agent, aerr := t.o.Agents.Agent(ctx, m); aerr == nil {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err = agent.Call(cctx, klientapi.MethodActivity, nil, &act)
			cancel()
		}
		at := time.Now()
		t.mu.Lock()
		cs.polling = false
		busy := false
		if err == nil {
			if !cs.at.IsZero() && at.After(cs.at) {
				busy = (act.CPUSeconds-cs.seconds)/at.Sub(cs.at).Seconds() > o.CPUThreshold
			}
			cs.seconds, cs.at = act.CPUSeconds, at
		}
		t.mu.Unlock()
		if err != nil && ctx.Err() == nil {
			t.log.Debug("idle stop: the agent's activity", "machine", m.ID, "err", err)
		}
		if busy {
			t.Touch(m.ID)
		}
	}()
}

// RestartCountdown starts machine id's countdown afresh (kloud starts it, or found it started):
// its last activity is now, its old deadline gone; the sweep sets the new one. Called before
// the machine is recorded Running, so the sweep never sees it Running with an old deadline.
func (t *Tracker) RestartCountdown(ctx context.Context, id string) {
	if err := t.o.Machines.ResetIdleCountdown(ctx, id, t.o.Now()); err != nil {
		t.log.Warn("idle stop: restart the countdown", "machine", id, "err", err)
	}
}

// stop starts the machine.stop job of an idle machine, unless activity came meanwhile.
func (t *Tracker) stop(ctx context.Context, m *model.Machine, timeout time.Duration, deadline time.Time) error {
	if t.lastActivity(m.ID).Add(timeout).After(deadline) {
		return nil // typed into since: the next sweep moves the deadline
	}
	t.log.Info("idle stop: stopping", "machine", m.ID, "timeout", timeout, "deadline", deadline)
	err := t.o.Power.Stop(ctx, m, Stop{Reason: ReasonPrefix + ShortDuration(timeout), Deadline: deadline, Timeout: timeout})
	if errors.Is(err, ErrBusy) {
		return nil // a job holds the machine, or it is no longer Running
	}
	return err
}

// StillDue is the idle stop job's last check before it stops the provider's machine: no
// activity on machineID since the sweep decided the stop of the countdown (deadline, timeout).
func (t *Tracker) StillDue(machineID string, deadline time.Time, timeout time.Duration) error {
	if last := t.lastActivity(machineID); last.Add(timeout).After(deadline) {
		return fmt.Errorf("idle stop cancelled: activity at %s", last.Format(time.RFC3339))
	}
	return nil
}

// ShortDuration prints d rounded to the second, without zero units ("30m", "1h30m", "45s").
func ShortDuration(d time.Duration) string {
	d = d.Round(time.Second)
	if d <= 0 {
		return "0s"
	}
	out := d.String()
	if strings.HasSuffix(out, "m0s") {
		out = strings.TrimSuffix(out, "0s")
	}
	if strings.HasSuffix(out, "h0m") {
		out = strings.TrimSuffix(out, "0m")
	}
	return out
}
