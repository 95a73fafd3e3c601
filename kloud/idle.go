package kloud

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/klient/klientapi"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/provider"
)

// Idle stop (issue 19 §5): kloud stops a Running machine nobody uses, as Koding did after 50
// minutes. A machine's settings are its own (machine.set), else its stack's template's
// (template.update idleTimeout, alwaysOn), else kloud's (IdleOptions.Timeout, kloud serve
// --idle-timeout; default 0: never).
//
// Activity is what kloud relays: a terminal attached or typed into (web terminals and `kloud
// ssh`; read-only viewers' keys do not count), port-forward connections and their traffic,
// web-app requests; and what the machine's agent reports (klient.activity, polled every
// CPUInterval while a countdown runs): its terminal sessions' processes using more than
// CPUThreshold of one CPU between two readings, e.g. a build left running in a detached terminal. It is noted in memory at once (touch) and written to the machine at most
// once per sweep (Machine.Idle.LastActivity, and the deadline: last activity + timeout), so a
// kloud restart neither loses nor resets a countdown. The sweep (runIdle, a background task)
// warns the machine's attached terminals a while before the deadline and, at the deadline,
// stops the machine through the durable machine.stop job with the reason "idle for <timeout>"
// (machine.list and machine.info show it; machine.start clears it and restarts the countdown).
// Activity noted up to the moment the job stops the provider's machine cancels the stop: a
// machine being typed into is never stopped.
//
// Autostart (machine.set autostart): a machine's schedule ("mon-fri 09:00" in a time zone) and
// its next start are in the machine document; at that time the sweep starts the machine with
// the machine.start job if it is Stopped, and moves the next start on either way.

// Idle stop defaults.
const (
	// KodingIdleTimeout is what Koding used; kloud's default is off (0).
	KodingIdleTimeout = 50 * time.Minute
	// DefaultIdleWarning is how long before an idle stop attached terminals are warned.
	DefaultIdleWarning = 5 * time.Minute
	// DefaultIdleInterval is how often kloud looks for idle machines and writes activity.
	DefaultIdleInterval = 15 * time.Second
	// DefaultIdleCPUThreshold is the share of one CPU above which a machine's processes count
	// as activity, and DefaultIdleCPUInterval how often kloud asks the agent.
	DefaultIdleCPUThreshold = 0.1
	DefaultIdleCPUInterval  = time.Minute
)

// IdleReasonPrefix starts the reason of a machine kloud stopped for being idle.
const IdleReasonPrefix = "idle for "

// IdleOptions configure the idle stop.
type IdleOptions struct {
	// Timeout is kloud's idle timeout, for machines whose template and own settings say
	// nothing (kloud serve --idle-timeout); 0 (the default): never.
	Timeout time.Duration
	// Warning is how long before the stop attached terminals get a warning line (kloud serve
	// --idle-warning; default DefaultIdleWarning; at most half the machine's timeout).
	Warning time.Duration
	// Interval is how often kloud looks for idle machines and writes the activity it saw
	// (default DefaultIdleInterval): the countdown's resolution, and the throttle of activity
	// writes (one per machine per interval at most).
	Interval time.Duration
	// CPUThreshold is the share of one CPU (0.1: 10%) the processes of a machine's terminal
	// sessions must use between two readings of its agent to count as activity (kloud serve
	// --idle-cpu-threshold; default DefaultIdleCPUThreshold; negative: CPU never counts).
	CPUThreshold float64
	// CPUInterval is how often kloud reads the CPU of a machine with a countdown from its agent
	// (default DefaultIdleCPUInterval).
	CPUInterval time.Duration
}

func (o *IdleOptions) defaults() error {
	if o.Timeout < 0 || o.Timeout > api.MaxIdleTimeout {
		return fmt.Errorf("kloud: --idle-timeout %s: want 0 (never) up to %s", o.Timeout, api.MaxIdleTimeout)
	}
	if o.Warning <= 0 {
		o.Warning = DefaultIdleWarning
	}
	if o.Interval <= 0 {
		o.Interval = DefaultIdleInterval
	}
	if o.CPUThreshold == 0 {
		o.CPUThreshold = DefaultIdleCPUThreshold
	}
	if o.CPUInterval <= 0 {
		o.CPUInterval = DefaultIdleCPUInterval
	}
	return nil
}

// idleTracker is what this kloud saw of its machines' activity since it last wrote it, and
// the countdowns whose terminals it warned.
type idleTracker struct {
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

func newIdleTracker() *idleTracker {
	return &idleTracker{last: map[string]time.Time{}, warned: map[string]time.Time{}, cpu: map[string]*cpuSample{}}
}

// touch notes activity on machine id now.
func (s *Server) touch(id string) {
	now := s.store.Now()
	t := s.idle
	t.mu.Lock()
	if now.After(t.last[id]) {
		t.last[id] = now
	}
	t.mu.Unlock()
}

// lastActivity is the latest activity this kloud saw on machine id (zero: none).
func (t *idleTracker) lastActivity(id string) time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.last[id]
}

// forget drops what the tracker holds of machines not in keep.
func (t *idleTracker) forget(keep map[string]bool) {
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
func (t *idleTracker) warnOnce(id string, deadline time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.warned[id].Equal(deadline) {
		return false
	}
	t.warned[id] = deadline
	return true
}

// idleSettings are machine m's settings in force: its own, else its template's (t, nil when
// gone), else kloud's; no timeout when m's provider cannot stop machines.
func (s *Server) idleSettings(m *Machine, t *Template) (timeout time.Duration, alwaysOn bool) {
	timeout = s.opts.Idle.Timeout
	if t != nil {
		if t.Idle.TimeoutSeconds != nil {
			timeout = time.Duration(*t.Idle.TimeoutSeconds) * time.Second
		}
		if t.Idle.AlwaysOn != nil {
			alwaysOn = *t.Idle.AlwaysOn
		}
	}
	if m.Idle.TimeoutSeconds != nil {
		timeout = time.Duration(*m.Idle.TimeoutSeconds) * time.Second
	}
	if m.Idle.AlwaysOn != nil {
		alwaysOn = *m.Idle.AlwaysOn
	}
	if s.capable(m.Provider, api.MethodMachineStop, provider.CapStop) != nil {
		timeout = 0 // its provider cannot stop it
	}
	return timeout, alwaysOn
}

// templates looks up the templates of machines' stacks, once per stack.
type templatesOf struct {
	s       *Server
	byStack map[string]*Template
}

func (s *Server) templatesOf() *templatesOf {
	return &templatesOf{s: s, byStack: map[string]*Template{}}
}

func (tc *templatesOf) of(ctx context.Context, m *Machine) *Template {
	if t, ok := tc.byStack[m.StackID]; ok {
		return t
	}
	var t *Template
	if st, err := tc.s.store.Stacks().Get(ctx, m.StackID); err == nil {
		t = tc.s.stackTemplate(ctx, st.TemplateID)
	}
	tc.byStack[m.StackID] = t
	return t
}

// showIdle fills in the idle settings in force of ms (machine.list, machine.info).
func (s *Server) showIdle(ctx context.Context, ms []Machine) {
	tc := s.templatesOf()
	for i := range ms {
		timeout, always := s.idleSettings(&ms[i], tc.of(ctx, &ms[i]))
		ms[i].Idle.EffectiveTimeoutSeconds, ms[i].Idle.EffectiveAlwaysOn = int64(timeout/time.Second), always
		if always || timeout == 0 || ms[i].State != provider.Running {
			ms[i].Idle.Deadline = time.Time{} // a countdown not in force (the sweep clears it)
		}
	}
}

// runIdle is the idle stop's background task: a sweep every interval.
func (s *Server) runIdle(ctx context.Context) {
	t := time.NewTicker(s.opts.Idle.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := s.idleSweep(ctx); err != nil && ctx.Err() == nil {
				s.log.Warn("idle stop: sweep", "err", err)
			}
		}
	}
}

// idleSweep writes the activity seen, warns and stops the Running machines that are idle.
func (s *Server) idleSweep(ctx context.Context) error {
	ms, err := s.store.Machines().InStates(ctx, []string{string(provider.Running)})
	if err != nil {
		return err
	}
	tc := s.templatesOf()
	keep := map[string]bool{}
	for i := range ms {
		m := &ms[i]
		keep[m.ID] = true
		timeout, always := s.idleSettings(m, tc.of(ctx, m))
		if err := s.idleCheck(ctx, m, timeout, always); err != nil {
			s.log.Warn("idle stop", "machine", m.ID, "err", err)
		}
	}
	s.idle.forget(keep)
	return s.autostartSweep(ctx)
}

// autostartSweep starts the Stopped machines whose scheduled start is due, and schedules the
// next start of every due machine.
func (s *Server) autostartSweep(ctx context.Context) error {
	now := s.store.Now()
	due, err := s.store.Machines().AutostartDue(ctx, now)
	if err != nil {
		return err
	}
	for i := range due {
		m := &due[i]
		sc, loc, err := api.ParseAutostart(m.Autostart.Schedule, m.Autostart.TZ)
		if err != nil {
			s.log.Warn("autostart: a schedule kloud cannot read; dropped", "machine", m.ID, "err", err)
			if err := s.store.Machines().SetAutostart(ctx, m.ID, nil); err != nil {
				return err
			}
			continue
		}
		ok, err := s.store.Machines().SetAutostartNext(ctx, m.ID, m.Autostart.Next, sc.Next(now, loc))
		if err != nil || !ok {
			continue // another kloud took it
		}
		if m.State != provider.Stopped {
			continue // running already, or busy: the next start is the next one
		}
		if _, err := s.powerJob(ctx, m, provider.MethodStart, m.Owner, powerParams{}); err != nil {
			s.log.Warn("autostart: start", "machine", m.ID, "err", err)
			continue
		}
		s.log.Info("autostart: starting", "machine", m.ID, "schedule", m.Autostart.Schedule, "tz", m.Autostart.TZ)
	}
	return nil
}

// idleCheck is the sweep of one Running machine.
func (s *Server) idleCheck(ctx context.Context, m *Machine, timeout time.Duration, always bool) error {
	now := s.store.Now()
	if always || timeout <= 0 {
		if !m.Idle.Deadline.IsZero() { // no countdown any more
			_, err := s.store.Machines().SetIdleCountdown(ctx, m.ID, string(provider.Running), m.Idle.LastActivity, time.Time{})
			return err
		}
		return nil
	}
	base := m.Idle.LastActivity
	if m.Idle.Deadline.IsZero() && base.Before(now) {
		base = now // a countdown starts (the machine got a timeout, or its settings changed)
	}
	if seen := s.idle.lastActivity(m.ID); seen.After(base) {
		base = seen
	}
	deadline := base.Add(timeout)
	if !base.Equal(m.Idle.LastActivity) || !deadline.Equal(m.Idle.Deadline) {
		ok, err := s.store.Machines().SetIdleCountdown(ctx, m.ID, string(provider.Running), base, deadline)
		if err != nil || !ok {
			return err // not Running any more, or another kloud wrote newer activity
		}
	}
	s.pollCPU(ctx, m)
	warnAt := deadline.Add(-min(s.opts.Idle.Warning, timeout/2))
	switch {
	case !now.Before(deadline):
		return s.idleStop(ctx, m, timeout, deadline)
	case !now.Before(warnAt) && s.idle.warnOnce(m.ID, deadline):
		n := s.relay.Notice(m.ID, fmt.Sprintf("\r\n[kloud] machine %s has been idle for %s and will be stopped in %s (at %s UTC); type anything to keep it running.\r\n",
			m.Label, ShortDuration(now.Sub(base)), ShortDuration(deadline.Sub(now)), deadline.UTC().Format("15:04:05")))
		s.log.Info("idle stop: warned", "machine", m.ID, "deadline", deadline, "terminals", n)
	}
	return nil
}

// pollCPU asks m's agent for its CPU time, at most every CPUInterval and one call at a time,
// in the background; CPU use above the threshold since the last reading is activity.
func (s *Server) pollCPU(ctx context.Context, m *Machine) {
	o := s.opts.Idle
	if o.CPUThreshold < 0 || m.KiteID == "" {
		return
	}
	now := time.Now()
	t := s.idle
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
		if agent, aerr := s.agentConn(m); aerr == nil {
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
			s.log.Debug("idle stop: the agent's activity", "machine", m.ID, "err", err)
		}
		if busy {
			s.touch(m.ID)
		}
	}()
}

// restartCountdown starts machine id's countdown afresh (kloud starts it, or found it started):
// its last activity is now, its old deadline gone; the sweep sets the new one. Called before
// the machine is recorded Running, so the sweep never sees it Running with an old deadline.
func (s *Server) restartCountdown(ctx context.Context, id string) {
	if err := s.store.Machines().ResetIdleCountdown(ctx, id, s.store.Now()); err != nil {
		s.log.Warn("idle stop: restart the countdown", "machine", id, "err", err)
	}
}

// idleStop starts the machine.stop job of an idle machine, unless activity came meanwhile.
func (s *Server) idleStop(ctx context.Context, m *Machine, timeout time.Duration, deadline time.Time) error {
	if s.idle.lastActivity(m.ID).Add(timeout).After(deadline) {
		return nil // typed into since: the next sweep moves the deadline
	}
	s.log.Info("idle stop: stopping", "machine", m.ID, "timeout", timeout, "deadline", deadline)
	_, err := s.powerJob(ctx, m, provider.MethodStop, m.Owner, powerParams{
		Reason: IdleReasonPrefix + ShortDuration(timeout), IdleDeadline: deadline.Format(time.RFC3339Nano), IdleTimeout: timeout.String()})
	if errors.Is(err, kite.ErrState) || errors.Is(err, store.ErrLocked) || errors.Is(err, kite.ErrConflict) {
		return nil // a job holds the machine, or it is no longer Running
	}
	return err
}

// idleStillDue is the idle stop job's last check before it stops the provider's machine: no
// activity since the sweep decided (params idleDeadline and idleTimeout; none: a user's stop).
func (s *Server) idleStillDue(machineID string, p powerParams) error {
	deadline, err1 := time.Parse(time.RFC3339Nano, p.IdleDeadline)
	timeout, err2 := time.ParseDuration(p.IdleTimeout)
	if err1 != nil || err2 != nil {
		return nil
	}
	if last := s.idle.lastActivity(machineID); last.Add(timeout).After(deadline) {
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

// machineSet serves machine.set: the machine's own idle settings (its owner, team admins).
func (s *Server) machineSet(ctx context.Context, c *Caller, _ *kite.Request, p *api.MachineSetParams) (api.Machine, error) {
	m, err := s.loadMachine(ctx, c, p.MachineID)
	if err != nil {
		return api.Machine{}, err
	}
	if !c.CanManage(m.Owner, m.Team) {
		return api.Machine{}, fmt.Errorf("machine %s belongs to %s: only its owner and team admins change its settings: %w", m.Label, m.Owner, kite.ErrPermission)
	}
	set := m.Idle.IdleSettings
	if p.IdleTimeout != "" {
		if set.TimeoutSeconds, err = api.ParseIdleTimeout(p.IdleTimeout); err != nil {
			return api.Machine{}, fmt.Errorf("%s: %w", err.Error(), kite.ErrInvalidParams)
		}
	}
	switch {
	case p.ResetAlwaysOn:
		set.AlwaysOn = nil
	case p.AlwaysOn != nil:
		set.AlwaysOn = p.AlwaysOn
	}
	if p.IdleTimeout != "" || p.AlwaysOn != nil || p.ResetAlwaysOn {
		if err := s.store.Machines().SetIdleSettings(ctx, m.ID, set); err != nil {
			return api.Machine{}, err
		}
	}
	switch p.Autostart {
	case "":
	case api.AutostartOff:
		if err := s.store.Machines().SetAutostart(ctx, m.ID, nil); err != nil {
			return api.Machine{}, err
		}
	default:
		sc, loc, err := api.ParseAutostart(p.Autostart, p.Timezone)
		if err != nil {
			return api.Machine{}, fmt.Errorf("%s: %w", err.Error(), kite.ErrInvalidParams)
		}
		if err := s.capable(m.Provider, api.MethodMachineSet, provider.CapStart); err != nil {
			return api.Machine{}, err
		}
		a := &Autostart{Schedule: strings.Join(strings.Fields(strings.ToLower(p.Autostart)), " "), TZ: loc.String(), Next: sc.Next(s.store.Now(), loc)}
		if err := s.store.Machines().SetAutostart(ctx, m.ID, a); err != nil {
			return api.Machine{}, err
		}
	}
	nm, err := s.loadMachine(ctx, c, m.ID)
	if err != nil {
		return api.Machine{}, err
	}
	ms := []Machine{*nm}
	s.showIdle(ctx, ms)
	return ms[0], nil
}

// templateIdle applies template.update's idle params to t's settings.
func templateIdle(p *api.TemplateParams, cur api.IdleSettings) (api.IdleSettings, bool, error) {
	if p.IdleTimeout == "" && p.AlwaysOn == nil {
		return cur, false, nil
	}
	if p.IdleTimeout != "" {
		n, err := api.ParseIdleTimeout(p.IdleTimeout)
		if err != nil {
			return cur, false, fmt.Errorf("%s: %w", err.Error(), kite.ErrInvalidParams)
		}
		cur.TimeoutSeconds = n
	}
	if p.AlwaysOn != nil {
		cur.AlwaysOn = p.AlwaysOn
		if !*p.AlwaysOn {
			cur.AlwaysOn = nil // false is the default
		}
	}
	return cur, true, nil
}
