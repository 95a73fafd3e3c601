package kloud

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/stackbuild"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/terraformer/tfapi"
	"github.com/kloud-dev/kloud/userdata"
)

// Stack update (issue 13 §1): stack.update applies another template revision (or the stack's
// own scaled files, stack.scale in stacks_scale.go) to a built stack, as a durable job on the
// stack's lease, like stack.apply. Start reading at runStackUpdate (stacks_update_job.go; the
// plan's diff is stacks_update_diff.go). What the job would refuse
// before changing anything (planUpdate: files Terraform or the policy refuses, no machine left,
// a constraint, a machine changing provider) is refused by the call itself, with no job.
//
// The update plans the new files twice: once alone (as stack.create does: which machines the
// files declare, by label), then, rendered with every machine's agent, against the stack's
// Terraform state, which says per machine what Terraform would do (add, change in place,
// replace, remove, nothing). A machine that stays is rendered with the agent configuration it
// was built with (Machine.AgentSealed), so its user data, and with it the machine, its disk,
// its agent and its terminal sessions, do not change. New and replaced machines get new agent
// keys; the planner waits only for their agents. Removed machines' keys are revoked and their
// records deleted once Terraform no longer has them.
//
// Durability: the stack is Building with the job's id while the job runs (the reconciler and
// stack.reset treat it as they treat a build). The new files, revision and machine records are
// written before Terraform runs; new and replaced machines are Building, removed ones
// Terminating, so a job recovered after a restart (Terraform's run recorded as the stack's
// TFJobID) knows whom to wait for and what to delete. A job that dies before its run was
// recorded, or fails, leaves the stack Failed with the new files: `kloud stack update` again
// converges it (or destroy).

const jobStackUpdate = "stack.update"

// updateParams are a stack.update job's parameters (job.get shows them; files and variables
// as JSON text, as they always were).
type updateParams struct {
	StackID   string                            `json:"stackId"`
	Lease     string                            `json:"lease"`
	From      string                            `json:"from"` // the stack's state before the job: it goes back to it if nothing changed
	Rev       int                               `json:"rev"`
	Diverged  bool                              `json:"diverged"`
	Files     store.JSONText[[]File]            `json:"files"`
	Variables store.JSONText[map[string]string] `json:"variables"`
	// What the update does in words, for the job's log, when it is not "from revision R to S"
	// (stack.scale: "scaling web from 2 to 3 machines").
	What string `json:"what"`
}

// Validate checks params decoded from a job (a job without a stack, lease owner or files was
// not made by stack.update, or its document is damaged) and takes an unknown From as Failed.
func (p *updateParams) Validate() error {
	if p.StackID == "" {
		return errors.New("stack.update job without a stackId")
	}
	if p.Lease == "" {
		return fmt.Errorf("stack.update job of stack %s without a lease owner", p.StackID)
	}
	if len(p.Files.V) == 0 {
		return fmt.Errorf("stack.update job of stack %s: no files", p.StackID)
	}
	if p.From != StackInitialized && p.From != StackFailed {
		p.From = StackFailed
	}
	return nil
}

// ---- agents kept across updates

func agentAAD(machineID string) []byte { return []byte("machines/" + machineID + "/agent") }

// sealAgents seals each machine's agent configuration (mintAgents stores them with the kite ids).
func (s *Server) sealAgents(cfgs agentConfigs) (map[string][]byte, error) {
	out := make(map[string][]byte, len(cfgs))
	for id, c := range cfgs {
		c.UserData, c.Hostname = "", "" // the template's and the label's, filled at each render
		b, err := json.Marshal(c)
		if err != nil {
			return nil, fmt.Errorf("machine %s: agent configuration: %w", id, err)
		}
		if out[id], err = s.store.Seal(b, agentAAD(id)); err != nil {
			return nil, fmt.Errorf("machine %s: seal agent configuration: %w", id, err)
		}
	}
	return out, nil
}

// openAgent returns the agent configuration m was last built with, if kloud kept it.
func (s *Server) openAgent(m *Machine) (userdata.Config, bool) {
	var c userdata.Config
	if len(m.AgentSealed) == 0 || m.KiteID == "" {
		return c, false
	}
	b, err := s.store.Open(m.AgentSealed, agentAAD(m.ID))
	if err != nil {
		s.log.Warn("open a machine's agent configuration (it gets a new agent key)", "machine", m.ID, "err", err)
		return c, false
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, false
	}
	return c, true
}

// placeholderKey stands for an agent key in a preview's rendering (stack.plan of a stack): it
// has a kite key's shape and opens nothing. Terraform plans with it and applies nothing.
const placeholderKey = "eyJhbGciOiJub25lIn0.eyJwbGFjZWhvbGRlciI6dHJ1ZX0.cGxhbg"

func (s *Server) placeholderAgent(st *Stack, m *Machine) userdata.Config {
	url := s.opts.PublicURL
	if p, err := s.providers.Lookup(m.Provider); err == nil {
		url = s.kloudURLFor(p)
	}
	sum := s.klientSum
	if sum == "" {
		sum = strings.Repeat("0", 64)
	}
	return userdata.Config{Username: st.Owner, KiteKey: placeholderKey, KontrolURL: url + "/kite", KlientURL: url + "/dl/klient", KlientSHA256: sum, CACert: s.opts.CACert}
}

// ---- latest revision (stack.describe, stack.list)

func stackPtrs(sts []Stack) []*Stack {
	out := make([]*Stack, len(sts))
	for i := range sts {
		out[i] = &sts[i]
	}
	return out
}

// fillLatestRev sets LatestRev and UpdateAvailable of each stack from its template. A template
// that is gone (or unreadable) leaves them unset.
func (s *Server) fillLatestRev(ctx context.Context, sts []*Stack) {
	revs := map[string]int{}
	for _, st := range sts {
		rev, ok := revs[st.TemplateID]
		if !ok {
			if t, err := s.store.Templates().Get(ctx, st.TemplateID); err == nil {
				rev = t.Rev
			}
			revs[st.TemplateID] = rev
		}
		st.LatestRev = rev
		st.UpdateAvailable = rev > st.TemplateRev && st.State != StackNotInitialized
	}
}

// ---- RPCs

// updateTarget returns the files of revision rev (0: the latest) of st's template.
func (s *Server) updateTarget(ctx context.Context, c *Caller, st *Stack, rev int) ([]File, int, error) {
	t, files, err := s.templateFiles(ctx, c, &api.StackPlanParams{TemplateID: st.TemplateID, Rev: rev})
	if errors.Is(err, kite.ErrNotFound) && rev == 0 {
		return nil, 0, fmt.Errorf("stack %s: its template %s is gone (or not yours to read): nothing to update to: %w", st.ID, st.TemplateID, kite.ErrNotFound)
	}
	if err != nil {
		return nil, 0, err
	}
	return files, t.Rev, nil
}

func (s *Server) stackUpdate(ctx context.Context, c *Caller, _ *kite.Request, p *api.StackUpdateParams) (api.JobRef, error) {
	st, err := s.loadStack(ctx, c, p.StackID)
	if err != nil {
		return api.JobRef{}, err
	}
	files, rev, err := s.updateTarget(ctx, c, st, p.TemplateRevision)
	if err != nil {
		return api.JobRef{}, err
	}
	return s.startUpdate(ctx, c, st, updateParams{StackID: st.ID, Rev: rev, Files: store.JSONTextOf(files), Variables: store.JSONTextOf(st.Variables)})
}

// startUpdate starts the update job as stack.apply starts its job (beginStackJob, stacks.go),
// once the update's checks passed.
func (s *Server) startUpdate(ctx context.Context, c *Caller, st *Stack, up updateParams) (api.JobRef, error) {
	if st.State == StackNotInitialized {
		return api.JobRef{}, fmt.Errorf("stack %s was never built: build it with `kloud stack apply %s` (it builds its recorded revision %d): %w", st.ID, st.ID, st.TemplateRev, kite.ErrState)
	}
	release, err := s.holdQuota(ctx, st.Owner, st.Team) // quota.go: held until the stack is Building
	if err != nil {
		return api.JobRef{}, err
	}
	defer release()
	sj := stackJob{lease: "update", verb: "be updated", noun: "update", from: []string{StackInitialized, StackFailed}, to: StackBuilding,
		set: store.StackSet{TFJobID: new("")}}
	return s.beginStackJob(ctx, c, st, sj, func(st *Stack, lease string) (jobSpec, error) {
		// What the job would refuse before changing anything (files Terraform or the template
		// policy refuses, no machine left, a constraint, a machine that would change provider)
		// is refused here, before a job exists. The job checks again: it may run after a restart.
		if _, _, _, err := s.planUpdate(ctx, c, st, up.Files.V, up.Variables.V, nil); err != nil {
			return jobSpec{}, err
		}
		up.Lease, up.From = lease, st.State
		return stackUpdateJob.spec(up)
	})
}

// stackPlanUpdate is stack.plan of a stack: what stack.update to the revision would do, per
// machine. It changes nothing: the plan runs against the stack's Terraform state as a preview
// (tfapi.Request.Preview), which puts the stack's stored files and variables back, so a
// later destroy never runs the previewed files. It holds the stack's lease meanwhile.
func (s *Server) stackPlanUpdate(ctx context.Context, c *Caller, p *api.StackPlanParams) (api.StackPlanResult, error) {
	st, err := s.loadStack(ctx, c, p.StackID)
	if err != nil {
		return api.StackPlanResult{}, err
	}
	if st.State != StackInitialized && st.State != StackFailed {
		return api.StackPlanResult{}, fmt.Errorf("stack %s is %s: an update can be planned for a built stack (Initialized or Failed): %w", st.ID, st.State, kite.ErrState)
	}
	files, rev, err := s.updateTarget(ctx, c, st, p.Rev)
	if err != nil {
		return api.StackPlanResult{}, err
	}
	_, release, err := s.takeLease(ctx, "stack/"+st.ID, "plan", "stack "+st.ID+" is busy (a job is changing it; plan when it is done)")
	if err != nil {
		return api.StackPlanResult{}, err
	}
	defer release()
	planned, ms, mt, err := s.planUpdate(ctx, c, st, files, st.Variables, nil)
	if err != nil {
		return api.StackPlanResult{}, err
	}
	agents := agentConfigs{}
	for _, m := range mt.kept {
		if cfg, ok := s.openAgent(m); ok {
			agents[m.ID] = cfg
		} else {
			agents[m.ID] = s.placeholderAgent(st, m)
		}
	}
	for i := range mt.added {
		agents[mt.added[i].ID] = s.placeholderAgent(st, &mt.added[i])
	}
	tpl, err := s.renderFor(ctx, c, st, files, st.Variables, mt, agents)
	if err != nil {
		return api.StackPlanResult{}, err
	}
	before := s.stackState(ctx, st.ID)
	changes, err := s.planStack(ctx, nil, st, tpl, true)
	if err != nil {
		return api.StackPlanResult{}, err
	}
	up := s.diffMachines(st, planned, ms, changes, before)
	up.FromRev, up.ToRev, up.Diverged = st.TemplateRev, rev, st.Diverged
	for i := range planned {
		planned[i].Attributes = stackbuild.VisibleAttrs(planned[i].Attributes)
	}
	return api.StackPlanResult{Machines: planned, TemplateID: st.TemplateID, Rev: rev, Update: &up}, nil
}

// ---- stack.apply after a failed update

// failedUpdate reports whether st is Failed by an update (its recorded job is a stack.update):
// its records may then not match its files (machines an update removed, or added, that
// terraform did or did not get to), and stack.apply converges it as an update of its own files
// (reapplyUpdate) instead of building every machine again.
//
// When the job is no longer known (expired), a stack whose machines were built before (they
// have agent keys) converges as an update too: that is right after a failed build as well
// (machines terraform made are awaited with the keys they have, the others built).
func (s *Server) failedUpdate(ctx context.Context, st *Stack) bool {
	if st.State != StackFailed {
		return false
	}
	if st.JobID != "" {
		j, err := s.store.Jobs().Get(ctx, st.JobID)
		if err == nil || !errors.Is(err, store.ErrNotFound) {
			return err == nil && j.Kind == jobStackUpdate
		}
	}
	ms, err := s.stackMachines(ctx, st.ID)
	if err != nil {
		return false
	}
	return slices.ContainsFunc(ms, func(m Machine) bool { return m.KiteID != "" })
}

// reapplyUpdate is stack.apply of a stack a failed update left: an update to the stack's own
// files, revision and variables. Machines that stayed Running keep their agents and disks; the
// others are built (or, if terraform made them, awaited) and the removed ones removed.
func (s *Server) reapplyUpdate(ctx context.Context, c *Caller, st *Stack) (api.JobRef, error) {
	return s.startUpdate(ctx, c, st, updateParams{StackID: st.ID, Rev: st.TemplateRev, Diverged: st.Diverged, Files: store.JSONTextOf(st.Files), Variables: store.JSONTextOf(st.Variables),
		What: fmt.Sprintf("applying revision %d again (only what drifted changes)", st.TemplateRev)})
}

// failUpdate stops terraform's run if the job was cancelled, drops the removed machines
// terraform did remove, and returns reason; stackbuild's ExitStack then moves the stack to Failed and the
// machines still Building or Terminating to Unknown.
func (s *Server) failUpdate(ctx context.Context, st *Stack, res *tfapi.Result, tfJob string, reason error) error {
	if ctx.Err() != nil {
		reason = fmt.Errorf("update cancelled: %w", reason)
	}
	s.stopTF(ctx, tfJob)
	if ms, err := s.flow().StackMachinesRetry(ctx, st.ID); err == nil {
		s.dropRemoved(ctx, st, ms, res)
	}
	return reason
}
