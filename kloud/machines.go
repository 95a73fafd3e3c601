package kloud

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/idle"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/stackbuild"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/provider"
)

// Machines: machine.list, machine.info (the provider is the truth; the store is reconciled),
// machine.start and machine.stop (durable jobs).

// machineAPI serves machine.list, machine.info, machine.start and machine.stop, and runs the
// machine.start and machine.stop jobs (routes.go's job kinds). New builds it once (Server.machines).
type machineAPI struct {
	machines  *store.Machines
	stacks    *store.Stacks
	providers *provider.Registry
	log       *slog.Logger
	idle      func() *idle.Tracker // Server.idle (New builds it after the area APIs; idle.go)
	k         machineKloud

	// infoWait bounds a machine.info call's wait for the provider (default machineInfoWait);
	// infoFlight runs one provider Info per machine at a time, which every machine.info of the
	// machine meanwhile joins.
	infoWait   time.Duration
	infoFlight singleflight.Group
}

// machineLoader is what the machine areas (machines.go, shares.go, ports.go) use of kloud's
// machines: one as a caller may see it, its provider's view, its provider's capabilities.
// *Server is one (machines.go).
type machineLoader interface {
	loadMachine(ctx context.Context, c *Caller, id string) (*model.Machine, error)
	providerMachine(ctx context.Context, c *Caller, m *model.Machine) (provider.Machine, error)
	capable(name, method string, cap provider.Capability) error
}

// machineKloud is what machineAPI uses of kloud's Server: its machines, the build flow (machine
// states and leases), the power jobs, the idle settings shown (idle.go), the planner and the
// agents' status (agents.go).
type machineKloud interface {
	machineLoader
	flow() *stackbuild.Flow
	powerJob(ctx context.Context, m *model.Machine, method, user string, p powerParams) (api.JobRef, error)
	showIdle(ctx context.Context, ms []model.Machine)
	planner() *stackbuild.Planner
	setAgent(ctx context.Context, kiteID, status, version string)
}

// canSee reports whether c may see machine m: its owner, a user it is shared with, a team admin.
func (c *Caller) canSee(m *model.Machine) bool {
	if m.Owner == c.Username || c.TeamAdmin(m.Team) {
		return true
	}
	for _, sh := range m.Shares {
		if sh.Username == c.Username {
			return true
		}
	}
	return false
}

func (s *Server) loadMachine(ctx context.Context, c *Caller, id string) (*model.Machine, error) {
	m, err := s.store.Machines().Get(ctx, id)
	if errors.Is(err, store.ErrNotFound) || err == nil && c != nil && !c.canSee(&m) {
		return nil, notFound("machine", id)
	}
	if err != nil {
		return nil, err
	}
	return &m, nil
}

// providerMachine builds the provider's view of m.
func (s *Server) providerMachine(ctx context.Context, c *Caller, m *model.Machine) (provider.Machine, error) {
	p, err := s.providers.Lookup(m.Provider)
	if err != nil {
		return nil, err
	}
	bm := &provider.BaseMachine{ID: m.ID, Label: m.Label, StackID: m.StackID, Provider: p, KiteID: m.KiteID, Owner: m.Owner,
		Attributes: m.Attributes, Meta: m.Meta, Log: s.log.With("machine", m.ID)}
	if p.HasPart(provider.PartCredential) {
		st, err := s.loadStack(ctx, nil, m.StackID)
		if err != nil {
			return nil, err
		}
		if c == nil {
			if c, err = s.callerByName(ctx, m.Owner, false); err != nil {
				return nil, err
			}
		}
		if id := st.Credentials[m.Provider]; id != "" {
			if bm.Credential, _, err = s.credentialFor(ctx, c, id, m.Provider); err != nil {
				return nil, err
			}
		}
	}
	return p.Machine(bm)
}

// list serves machine.list.
func (a *machineAPI) list(ctx context.Context, c *Caller, _ *kite.Request, p *api.MachineListParams) (api.MachineListResult, error) {
	f := store.MachineFilter{Visible: c.Username, StackID: p.StackID}
	if p.Team != "" {
		if !c.TeamAdmin(p.Team) {
			return api.MachineListResult{}, fmt.Errorf("listing a team's machines needs a team admin: %w", kite.ErrPermission)
		}
		f.Visible, f.Team = "", p.Team
	}
	ms, err := a.machines.List(ctx, f)
	if err != nil {
		return api.MachineListResult{}, err
	}
	a.k.showIdle(ctx, ms) // idle.go
	return api.MachineListResult{Machines: ms, StackTitles: a.stackTitles(ctx, ms)}, nil
}

// stackTitles returns the titles of the stacks of ms by stack id; a stack that cannot be read
// (gone meanwhile) is left out.
func (a *machineAPI) stackTitles(ctx context.Context, ms []model.Machine) map[string]string {
	out := map[string]string{}
	for _, m := range ms {
		if _, ok := out[m.StackID]; ok || m.StackID == "" {
			continue
		}
		if st, err := a.stacks.Get(ctx, m.StackID); err == nil {
			out[m.StackID] = st.Title
		}
	}
	return out
}

// machineInfoWait bounds a machine.info call's wait for the provider's part (its Info), and
// machineInfoMax the provider's Info itself, which goes on after the call gave up waiting.
const (
	machineInfoWait = 20 * time.Second
	machineInfoMax  = 5 * time.Minute
)

// infoAnswer is what a provider's Info said, and whether kloud recorded it.
type infoAnswer struct {
	state      provider.State
	reconciled bool
}

// info serves machine.info.
func (a *machineAPI) info(ctx context.Context, c *Caller, _ *kite.Request, p *api.MachineRef) (api.MachineInfo, error) {
	m, err := a.k.loadMachine(ctx, c, p.MachineID)
	if err != nil {
		return api.MachineInfo{}, err
	}
	cur := m.State
	show := []model.Machine{*m}
	a.k.showIdle(ctx, show) // idle.go
	m = &show[0]
	out := api.MachineInfo{Machine: *m, StackTitle: a.stackTitles(ctx, []model.Machine{*m})[m.StackID], InfraState: cur}
	if cur == provider.NotInitialized || cur.InProgress() {
		return out, nil // nothing to ask the provider, or a job is changing it right now
	}
	if err := a.k.capable(m.Provider, api.MethodMachineInfo, provider.CapInfo); err != nil {
		out.InfoError = err.Error() // what kloud knows is all there is
		return out, nil
	}
	pm, err := a.k.providerMachine(ctx, c, m)
	if err != nil {
		return api.MachineInfo{}, err
	}
	// One Info per machine at a time, whatever the number of callers, run apart from this
	// call and bounded by machineInfoMax: a provider that is slow to answer (vagrant status on a
	// loaded host) costs the caller at most infoWait, the answer is then what kloud knows with
	// why the provider's part is missing, and what the provider says later is still recorded,
	// for the next machine.info (and machine.list) to show.
	id := m.ID
	ch := a.infoFlight.DoChan(id, func() (any, error) {
		ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), machineInfoMax)
		defer cancel()
		state, meta, err := pm.Info(ictx)
		if err != nil {
			return nil, err
		}
		ans := infoAnswer{state: state}
		if state != cur && state != provider.Unknown {
			if state == provider.Running {
				a.idle().RestartCountdown(ictx, id) // idle.go: started outside kloud: a new countdown
			}
			// The provider is the truth: record what it says (unless a job started meanwhile).
			set := store.MachineSet{State: new(string(state)), Reason: new("reconciled with the provider"), Meta: meta}
			ans.reconciled = a.k.flow().SetMachine(ictx, id, []provider.State{cur}, set)
		}
		return ans, nil
	})
	wait := a.infoWait
	if wait <= 0 {
		wait = machineInfoWait
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case r := <-ch:
		if r.Err != nil {
			out.InfoError = r.Err.Error()
			return out, nil
		}
		ans := r.Val.(infoAnswer)
		out.InfraState = ans.state
		if ans.reconciled {
			out.State, out.Reason = ans.state, "reconciled with the provider"
		}
	case <-timer.C:
		out.InfoError = fmt.Sprintf("the provider did not answer within %s (kloud goes on asking it for up to %s; machine.info shows its answer once it came)", wait, machineInfoMax)
	case <-ctx.Done():
		return api.MachineInfo{}, ctx.Err()
	}
	return out, nil
}

// power serves machine.start or machine.stop (method).
func (a *machineAPI) power(method string) func(ctx context.Context, c *Caller, r *kite.Request, p *api.MachineRef) (api.JobRef, error) {
	return func(ctx context.Context, c *Caller, _ *kite.Request, p *api.MachineRef) (api.JobRef, error) {
		m, err := a.k.loadMachine(ctx, c, p.MachineID)
		if err != nil {
			return api.JobRef{}, err
		}
		if m.Owner != c.Username && !c.TeamAdmin(m.Team) && !hasGrant(m, c.Username, model.GrantFull) {
			return api.JobRef{}, fmt.Errorf("only the owner may %s machine %s: %w", method, m.Label, kite.ErrPermission)
		}
		return a.k.powerJob(ctx, m, method, c.Username, powerParams{})
	}
}

// powerParams are a machine.start or machine.stop job's params (job.get shows them).
type powerParams struct {
	MachineID string         `json:"machineId"`
	Lease     string         `json:"lease"` // the owner name of the machine's lease the call took
	From      provider.State `json:"from"`  // the machine's state before the job
	// The idle stop's (idle.go): the machine's reason once stopped, and the sweep's deadline
	// (RFC 3339) and timeout (a duration) that idleStillDue checks again.
	Reason       string `json:"reason,omitempty"`
	IdleDeadline string `json:"idleDeadline,omitempty"`
	IdleTimeout  string `json:"idleTimeout,omitempty"`
}

// machineResult is a machine job's result: the machine and the state it ended in.
type machineResult struct {
	MachineID string         `json:"machineId"`
	State     provider.State `json:"state"`
}

// powerJob starts the machine.start or machine.stop job of m for user (the idle stop's too,
// idle.go); p are the job's params but the machine, lease and state it starts from.
func (s *Server) powerJob(ctx context.Context, m *model.Machine, method, user string, p powerParams) (api.JobRef, error) {
	if err := s.capable(m.Provider, "machine."+method, provider.Capability(method)); err != nil {
		return api.JobRef{}, err
	}
	owner, release, err := s.flow().TakeLease(ctx, "machine/"+m.ID, method, "machine "+m.Label+" is busy")
	if err != nil {
		return api.JobRef{}, err
	}
	during, _ := provider.Transition(method)
	if !s.flow().SetMachine(ctx, m.ID, provider.FromStates(method), store.MachineSet{State: new(string(during)), Reason: new("")}) {
		release()
		return api.JobRef{}, fmt.Errorf("machine %s is %s; %s is allowed only from %v: %w", m.Label, m.State, method, provider.FromStates(method), kite.ErrState)
	}
	p.MachineID, p.Lease, p.From = m.ID, owner, m.State
	id, err := powerJobKind(method).Start(ctx, s, "machine/"+m.ID, user, p)
	if err != nil {
		// SetMachine retries with its own context; if it still fails, the reconciler
		// finds the machine in a transition without a job.
		s.flow().SetMachine(ctx, m.ID, []provider.State{during}, store.MachineSet{State: new(string(m.State)), Reason: new(fmt.Sprintf("could not start the %s job: %v", method, err))})
		release()
		return api.JobRef{}, err
	}
	return api.JobRef{JobID: id}, nil
}

// providerOf returns the provider called name, or nil.
func (a *machineAPI) providerOf(name string) *provider.Provider {
	p, _ := a.providers.Lookup(name)
	return p
}

// capable fails with provider.ErrUnsupported (-32005) unless the provider called name has
// capability cap, which method needs.
func (s *Server) capable(name, method string, cap provider.Capability) error {
	p, err := s.providers.Lookup(name)
	if err != nil {
		return fmt.Errorf("%s: %s: %w", method, err.Error(), kite.ErrState)
	}
	if !p.Can(cap) {
		return fmt.Errorf("%s: provider %s does not support %s: %w", method, name, cap, provider.ErrUnsupported)
	}
	return nil
}

// idleStillDue is the idle stop job's last check before it stops the provider's machine: no
// activity since the sweep decided (params idleDeadline and idleTimeout; none: a user's stop).
func (a *machineAPI) idleStillDue(machineID string, p powerParams) error {
	deadline, err1 := time.Parse(time.RFC3339Nano, p.IdleDeadline)
	timeout, err2 := time.ParseDuration(p.IdleTimeout)
	if err1 != nil || err2 != nil {
		return nil
	}
	return a.idle().StillDue(machineID, deadline, timeout)
}

func hasGrant(m *model.Machine, user, grant string) bool {
	for _, sh := range m.Shares {
		if sh.Username == user && sh.Grant == grant {
			return true
		}
	}
	return false
}

// runPower is the machine.start or machine.stop (method) job.
func (a *machineAPI) runPower(ctx context.Context, j *jobCtx, method string, p powerParams, recovering bool) (res machineResult, err error) {
	id, owner, from := p.MachineID, p.Lease, p.From
	during, after := provider.Transition(method)
	// No state without an exit: an error on a path that did not put the machine back (or whose
	// write did not land), or a panic, leaves it Unknown (machine.info asks the provider).
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("internal error: %v", p)
		}
		if err != nil && !errors.Is(err, store.ErrLocked) {
			reason := fmt.Sprintf("%s job %s ended: %v", method, j.ID, err)
			if a.k.flow().SetMachine(ctx, id, []provider.State{during}, store.MachineSet{State: new(string(provider.Unknown)), Reason: new(reason)}) {
				a.log.WarnContext(ctx, "machine job ended without its bookkeeping; machine moved to Unknown", "machine", id, "job", j.ID, "err", err)
			}
		}
	}()
	if recovering {
		if j.CancelRequested {
			return machineResult{}, fmt.Errorf("cancelled while no kloud ran it: %w", store.ErrJobCancelled)
		}
		if err := a.k.flow().RetakeLease(ctx, "machine/"+id, owner); err != nil {
			return machineResult{}, fmt.Errorf("machine %s: %w", id, err)
		}
		j.Logf(ctx, "kloud restarted during this job; running it again")
	}
	defer a.k.flow().KeepLease(context.Background(), "machine/"+id, owner)()
	m, err := a.k.loadMachine(ctx, nil, id)
	if err != nil {
		return machineResult{}, err
	}
	fail := func(err error) (machineResult, error) {
		if ctx.Err() != nil {
			err = fmt.Errorf("%s cancelled: %w", method, err)
		}
		// Back to what the provider says, else to where we started. The provider is asked
		// with a context of its own: a cancelled job still ends in an honest state.
		state := from
		ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if pm, perr := a.k.providerMachine(ictx, nil, m); perr == nil && a.k.capable(m.Provider, api.MethodMachineInfo, provider.CapInfo) == nil {
			if st, _, ierr := pm.Info(ictx); ierr == nil && st != provider.Unknown {
				state = st
			}
		}
		a.k.flow().SetMachine(ctx, m.ID, []provider.State{during}, store.MachineSet{State: new(string(state)), Reason: new(err.Error())})
		return machineResult{}, err
	}
	if err := a.k.capable(m.Provider, "machine."+method, provider.Capability(method)); err != nil {
		return fail(err) // the provider changed since the job was started (a plugin re-registered)
	}
	pm, err := a.k.providerMachine(ctx, nil, m)
	if err != nil {
		return fail(err)
	}
	stage, done := stackbuild.MachineStopping, stackbuild.MachineStopped
	if method == provider.MethodStart {
		stage, done = stackbuild.MachineStarting, stackbuild.MachineStarted
	}
	if method == provider.MethodStop {
		if err := a.idleStillDue(m.ID, p); err != nil { // the idle stop (kloud/idle): typed into meanwhile
			return fail(err)
		}
	}
	j.Enter(ctx, stage)
	var meta any
	if method == provider.MethodStart {
		meta, err = pm.Start(ctx)
	} else {
		meta, err = pm.Stop(ctx)
	}
	if err != nil {
		return fail(fmt.Errorf("%s %s: %w", method, m.Label, err))
	}
	set := store.MachineSet{State: new(string(after)), Reason: new(p.Reason), Meta: meta} // the idle stop's reason (idle.go)
	if method == provider.MethodStart {
		j.Enter(ctx, stackbuild.MachineAgent)
		pl := a.k.planner()
		r := pl.Wait(ctx, []stackbuild.Expect{{Label: m.Label, KiteID: m.KiteID, Machine: pm, Provider: a.providerOf(m.Provider)}}, nil)[0]
		if !r.OK {
			return fail(fmt.Errorf("started, but %s failed: %w", r.Step, r.Err))
		}
		version := ""
		if r.Info != nil {
			version = r.Info.Version
			if r.Info.SSHHostKey != "" { // kloud/relay ssh.go: what config-ssh pins
				set.SSHHostKey = new(r.Info.SSHHostKey)
			}
		}
		a.k.setAgent(ctx, m.KiteID, model.AgentConnected, version)
	}
	// idle.go: a start begins a new countdown (before the machine is Running, so an old
	// deadline is never seen with it), a stop ends one.
	a.idle().RestartCountdown(ctx, m.ID)
	a.k.flow().SetMachine(ctx, m.ID, []provider.State{during}, set)
	j.Enter(ctx, done)
	return machineResult{MachineID: m.ID, State: after}, nil
}
