package kloud

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/stackbuild"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/provider"
)

// Machines: machine.list, machine.info (the provider is the truth; the store is reconciled),
// machine.start and machine.stop (durable jobs).

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

func (s *Server) machineList(ctx context.Context, c *Caller, _ *kite.Request, p *api.MachineListParams) (api.MachineListResult, error) {
	f := store.MachineFilter{Visible: c.Username, StackID: p.StackID}
	if p.Team != "" {
		if !c.TeamAdmin(p.Team) {
			return api.MachineListResult{}, fmt.Errorf("listing a team's machines needs a team admin: %w", kite.ErrPermission)
		}
		f.Visible, f.Team = "", p.Team
	}
	ms, err := s.store.Machines().List(ctx, f)
	if err != nil {
		return api.MachineListResult{}, err
	}
	s.showIdle(ctx, ms) // idle.go
	return api.MachineListResult{Machines: ms, StackTitles: s.stackTitles(ctx, ms)}, nil
}

// stackTitles returns the titles of the stacks of ms by stack id; a stack that cannot be read
// (gone meanwhile) is left out.
func (s *Server) stackTitles(ctx context.Context, ms []model.Machine) map[string]string {
	out := map[string]string{}
	for _, m := range ms {
		if _, ok := out[m.StackID]; ok || m.StackID == "" {
			continue
		}
		if st, err := s.store.Stacks().Get(ctx, m.StackID); err == nil {
			out[m.StackID] = st.Title
		}
	}
	return out
}

func (s *Server) machineInfo(ctx context.Context, c *Caller, _ *kite.Request, p *api.MachineRef) (api.MachineInfo, error) {
	m, err := s.loadMachine(ctx, c, p.MachineID)
	if err != nil {
		return api.MachineInfo{}, err
	}
	cur := m.State
	show := []model.Machine{*m}
	s.showIdle(ctx, show) // idle.go
	m = &show[0]
	out := api.MachineInfo{Machine: *m, StackTitle: s.stackTitles(ctx, []model.Machine{*m})[m.StackID], InfraState: cur}
	if cur == provider.NotInitialized || cur.InProgress() {
		return out, nil // nothing to ask the provider, or a job is changing it right now
	}
	if err := s.capable(m.Provider, api.MethodMachineInfo, provider.CapInfo); err != nil {
		out.InfoError = err.Error() // what kloud knows is all there is
		return out, nil
	}
	pm, err := s.providerMachine(ctx, c, m)
	if err != nil {
		return api.MachineInfo{}, err
	}
	state, meta, err := pm.Info(ctx)
	if err != nil {
		out.InfoError = err.Error()
		return out, nil
	}
	out.InfraState = state
	if state != cur && state != provider.Unknown {
		if state == provider.Running {
			s.restartCountdown(ctx, m.ID) // idle.go: started outside kloud: a new countdown
		}
		// The provider is the truth: record what it says (unless a job started meanwhile).
		set := store.MachineSet{State: new(string(state)), Reason: new("reconciled with the provider"), Meta: meta}
		if s.flow().SetMachine(ctx, m.ID, []provider.State{cur}, set) {
			out.State, out.Reason = state, "reconciled with the provider"
		}
	}
	return out, nil
}

func (s *Server) machinePower(method string) func(ctx context.Context, c *Caller, r *kite.Request, p *api.MachineRef) (api.JobRef, error) {
	return func(ctx context.Context, c *Caller, _ *kite.Request, p *api.MachineRef) (api.JobRef, error) {
		m, err := s.loadMachine(ctx, c, p.MachineID)
		if err != nil {
			return api.JobRef{}, err
		}
		if m.Owner != c.Username && !c.TeamAdmin(m.Team) && !hasGrant(m, c.Username, model.GrantFull) {
			return api.JobRef{}, fmt.Errorf("only the owner may %s machine %s: %w", method, m.Label, kite.ErrPermission)
		}
		return s.powerJob(ctx, m, method, c.Username, powerParams{})
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
func (s *Server) providerOf(name string) *provider.Provider {
	p, _ := s.providers.Lookup(name)
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

func hasGrant(m *model.Machine, user, grant string) bool {
	for _, sh := range m.Shares {
		if sh.Username == user && sh.Grant == grant {
			return true
		}
	}
	return false
}

func (s *Server) runMachinePower(ctx context.Context, j *jobCtx, method string, p powerParams, recovering bool) (res machineResult, err error) {
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
			if s.flow().SetMachine(ctx, id, []provider.State{during}, store.MachineSet{State: new(string(provider.Unknown)), Reason: new(reason)}) {
				s.log.WarnContext(ctx, "machine job ended without its bookkeeping; machine moved to Unknown", "machine", id, "job", j.ID, "err", err)
			}
		}
	}()
	if recovering {
		if j.CancelRequested {
			return machineResult{}, fmt.Errorf("cancelled while no kloud ran it: %w", store.ErrJobCancelled)
		}
		if err := s.flow().RetakeLease(ctx, "machine/"+id, owner); err != nil {
			return machineResult{}, fmt.Errorf("machine %s: %w", id, err)
		}
		j.Logf(ctx, "kloud restarted during this job; running it again")
	}
	defer s.flow().KeepLease(context.Background(), "machine/"+id, owner)()
	m, err := s.loadMachine(ctx, nil, id)
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
		if pm, perr := s.providerMachine(ictx, nil, m); perr == nil && s.capable(m.Provider, api.MethodMachineInfo, provider.CapInfo) == nil {
			if st, _, ierr := pm.Info(ictx); ierr == nil && st != provider.Unknown {
				state = st
			}
		}
		s.flow().SetMachine(ctx, m.ID, []provider.State{during}, store.MachineSet{State: new(string(state)), Reason: new(err.Error())})
		return machineResult{}, err
	}
	if err := s.capable(m.Provider, "machine."+method, provider.Capability(method)); err != nil {
		return fail(err) // the provider changed since the job was started (a plugin re-registered)
	}
	pm, err := s.providerMachine(ctx, nil, m)
	if err != nil {
		return fail(err)
	}
	stage, done := stackbuild.MachineStopping, stackbuild.MachineStopped
	if method == provider.MethodStart {
		stage, done = stackbuild.MachineStarting, stackbuild.MachineStarted
	}
	if method == provider.MethodStop {
		if err := s.idleStillDue(m.ID, p); err != nil { // idle.go: typed into meanwhile
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
		pl := s.planner()
		r := pl.Wait(ctx, []stackbuild.Expect{{Label: m.Label, KiteID: m.KiteID, Machine: pm, Provider: s.providerOf(m.Provider)}}, nil)[0]
		if !r.OK {
			return fail(fmt.Errorf("started, but %s failed: %w", r.Step, r.Err))
		}
		version := ""
		if r.Info != nil {
			version = r.Info.Version
		}
		s.setAgent(ctx, m.KiteID, model.AgentConnected, version)
	}
	// idle.go: a start begins a new countdown (before the machine is Running, so an old
	// deadline is never seen with it), a stop ends one.
	s.restartCountdown(ctx, m.ID)
	s.flow().SetMachine(ctx, m.ID, []provider.State{during}, set)
	j.Enter(ctx, done)
	return machineResult{MachineID: m.ID, State: after}, nil
}
