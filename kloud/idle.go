package kloud

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/idle"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/provider"
)

// The idle stop and autostart are package kloud/idle (what counts as activity, the countdown,
// the warnings, the sweep); kloud builds its Tracker here (idleDeps: kloud's machines, stacks'
// templates, power jobs, agents and the relay's notices as the tracker's small interfaces;
// the relay reports activity to Tracker.Touch), runs its sweep as a background task (routes.go)
// and serves machine.set (idleAPI).

// Idle stop defaults (kloud/idle's).
const (
	// KodingIdleTimeout is what Koding used; kloud's default is off (0).
	KodingIdleTimeout = idle.KodingTimeout
	// DefaultIdleWarning is how long before an idle stop attached terminals are warned.
	DefaultIdleWarning = idle.DefaultWarning
	// DefaultIdleInterval is how often kloud looks for idle machines and writes activity.
	DefaultIdleInterval = idle.DefaultInterval
	// DefaultIdleCPUThreshold is the share of one CPU above which a machine's processes count
	// as activity, and DefaultIdleCPUInterval how often kloud asks the agent.
	DefaultIdleCPUThreshold = idle.DefaultCPUThreshold
	DefaultIdleCPUInterval  = idle.DefaultCPUInterval
)

// IdleReasonPrefix starts the reason of a machine kloud stopped for being idle.
const IdleReasonPrefix = idle.ReasonPrefix

// IdleOptions configure the idle stop (kloud/idle's Settings).
type IdleOptions = idle.Settings

func newIdle(s *Server) (*idle.Tracker, error) {
	d := idleDeps{s}
	return idle.New(idle.Options{Settings: s.opts.Idle, Machines: s.store.Machines(), Templates: d, Power: d,
		Notices: d, Agents: d, Now: s.store.Now, Logger: s.log})
}

// idleDeps is kloud as the idle stop's Templates, Power, Notices and Agents.
type idleDeps struct{ s *Server }

// Notice writes text to machine id's terminals attached through the relay (built after the
// tracker: the relay reports activity to it).
func (d idleDeps) Notice(id, text string) int { return d.s.relay.Notice(id, text) }

func (d idleDeps) StackTemplate(ctx context.Context, stackID string) *model.Template {
	st, err := d.s.store.Stacks().Get(ctx, stackID)
	if err != nil {
		return nil
	}
	return d.s.stackTemplate(ctx, st.TemplateID)
}

func (d idleDeps) CanStop(name string) bool {
	return d.s.capable(name, api.MethodMachineStop, provider.CapStop) == nil
}

func (d idleDeps) Stop(ctx context.Context, m *model.Machine, st idle.Stop) error {
	_, err := d.s.powerJob(ctx, m, provider.MethodStop, m.Owner, powerParams{
		Reason: st.Reason, IdleDeadline: st.Deadline.Format(time.RFC3339Nano), IdleTimeout: st.Timeout.String()})
	if errors.Is(err, kite.ErrState) || errors.Is(err, store.ErrLocked) || errors.Is(err, kite.ErrConflict) {
		return fmt.Errorf("%w: %w", idle.ErrBusy, err)
	}
	return err
}

func (d idleDeps) Start(ctx context.Context, m *model.Machine) error {
	_, err := d.s.powerJob(ctx, m, provider.MethodStart, m.Owner, powerParams{})
	return err
}

func (d idleDeps) Agent(ctx context.Context, m *model.Machine) (idle.Agent, error) {
	c, err := d.s.agentConn(ctx, m)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// showIdle fills in the idle settings in force of ms (machine.list, machine.info).
func (s *Server) showIdle(ctx context.Context, ms []model.Machine) { s.idle.Show(ctx, ms) }

// ShortDuration prints d rounded to the second, without zero units ("30m", "1h30m", "45s").
func ShortDuration(d time.Duration) string { return idle.ShortDuration(d) }

// idleAPI serves machine.set (routes.go): a machine's own idle settings and autostart.
type idleAPI struct {
	machines    *store.Machines
	now         func() time.Time                                                        // the store's clock
	loadMachine func(ctx context.Context, c *Caller, id string) (*model.Machine, error) // machines.go
	capable     func(name, method string, cap provider.Capability) error                // machines.go
	show        func(ctx context.Context, ms []model.Machine)                           // showIdle
}

// machineSet serves machine.set: the machine's own idle settings (its owner, team admins).
func (a *idleAPI) machineSet(ctx context.Context, c *Caller, _ *kite.Request, p *api.MachineSetParams) (model.Machine, error) {
	m, err := a.loadMachine(ctx, c, p.MachineID)
	if err != nil {
		return model.Machine{}, err
	}
	if !c.CanManage(m.Owner, m.Team) {
		return model.Machine{}, fmt.Errorf("machine %s belongs to %s: only its owner and team admins change its settings: %w", m.Label, m.Owner, kite.ErrPermission)
	}
	set := m.Idle.IdleSettings
	if p.IdleTimeout != "" {
		if set.TimeoutSeconds, err = api.ParseIdleTimeout(p.IdleTimeout); err != nil {
			return model.Machine{}, fmt.Errorf("%s: %w", err.Error(), kite.ErrInvalidParams)
		}
	}
	switch {
	case p.ResetAlwaysOn:
		set.AlwaysOn = nil
	case p.AlwaysOn != nil:
		set.AlwaysOn = p.AlwaysOn
	}
	if p.IdleTimeout != "" || p.AlwaysOn != nil || p.ResetAlwaysOn {
		if err := a.machines.SetIdleSettings(ctx, m.ID, set); err != nil {
			return model.Machine{}, err
		}
	}
	switch p.Autostart {
	case "":
	case api.AutostartOff:
		if err := a.machines.SetAutostart(ctx, m.ID, nil); err != nil {
			return model.Machine{}, err
		}
	default:
		sc, loc, err := api.ParseAutostart(p.Autostart, p.Timezone)
		if err != nil {
			return model.Machine{}, fmt.Errorf("%s: %w", err.Error(), kite.ErrInvalidParams)
		}
		if err := a.capable(m.Provider, api.MethodMachineSet, provider.CapStart); err != nil {
			return model.Machine{}, err
		}
		auto := &model.Autostart{Schedule: strings.Join(strings.Fields(strings.ToLower(p.Autostart)), " "), TZ: loc.String(), Next: sc.Next(a.now(), loc)}
		if err := a.machines.SetAutostart(ctx, m.ID, auto); err != nil {
			return model.Machine{}, err
		}
	}
	nm, err := a.loadMachine(ctx, c, m.ID)
	if err != nil {
		return model.Machine{}, err
	}
	ms := []model.Machine{*nm}
	a.show(ctx, ms)
	return ms[0], nil
}

// templateIdle applies template.update's idle params to t's settings.
func templateIdle(p *api.TemplateParams, cur model.IdleSettings) (model.IdleSettings, bool, error) {
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
