package stackbuild

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	tfjson "github.com/hashicorp/terraform-json"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/provider/tmpl"
	"github.com/kloud-dev/kloud/terraformer/tfapi"
)

// Deps are what the build flow needs of kloud: the store's repositories, terraformer, the
// provider registry, kontrol, and a few checks that stay kloud's (each a small interface
// defined here). kloud fills them (kloud/stacks_deps.go) and calls the Flow from its handlers
// and job kinds; stackbuild never imports kloud.
type Deps struct {
	Store *store.Store
	// Terraformer returns terraformer's client, or an error saying none is configured.
	Terraformer func() (Terraformer, error)
	Providers   *provider.Registry
	Kontrol     Kontrol
	// Policy checks a stack's files against the template policy (kloud/policy.go).
	Policy Policy
	// What the flow asks of kloud itself.
	Callers   Callers
	Templates Templates
	Plans     Plans
	Quota     Quota
	Machines  Machines
	// Agents is what machines' agents are told about kloud (Mint).
	Agents AgentSource
	// Planner returns the planner that waits for the machines' agents (kloud's timeout, log
	// and metrics).
	Planner func() *Planner
	// JobLease is how long a job runner's lease lasts (0: 30s): a queued job older than it by
	// staleJobAfter was never started.
	JobLease time.Duration
	Log      *slog.Logger // nil: discard
}

// Terraformer is what the build flow asks of terraformer (kloud.Terraformer, a
// *tfclient.Client, has it).
type Terraformer interface {
	Plan(ctx context.Context, req tfapi.Request) (jobID string, err error)
	Apply(ctx context.Context, req tfapi.Request) (jobID string, err error)
	Destroy(ctx context.Context, req tfapi.Request) (jobID string, err error)
	// Wait follows a job to its end, calling fn for every event, and returns the final job.
	Wait(ctx context.Context, jobID string, fn func(tfapi.Event)) (*tfapi.Job, error)
	Cancel(ctx context.Context, jobID string) (*tfapi.Job, error)
	// State is the content id's last state (kite.ErrNotFound when there is none).
	State(ctx context.Context, contentID string) (*tfjson.State, error)
}

// Kontrol is what the build flow asks of kontrol: minting a machine's agent key, revoking a
// destroyed or replaced machine's.
type Kontrol interface {
	CreateAgentKey(a kitekey.AgentKeySpec) (key, kiteID string, err error)
	Revoke(ctx context.Context, jti, reason string) error
}

// Policy is the template policy (kloud/policy.go).
type Policy interface {
	// CheckDestroy refuses files whose destroy the policy does not allow.
	CheckDestroy(ctx context.Context, team string, files map[string][]byte) error
}

// Caller is whom a job runs as, as kloud resolved it (its *kloud.Caller): the flow only hands
// it back to kloud's hooks.
type Caller interface {
	CallerName() string
}

// Callers resolves a job's owner (kloud's callerByName, not as an administrator).
type Callers interface {
	Caller(ctx context.Context, username string) (Caller, error)
}

// Built is a template ready for Terraform: files, variables, credentials (kloud's build).
type Built struct {
	Files     map[string][]byte
	Config    *tmpl.Config // Files parsed: the one parse of a build, handed on to the providers
	Variables map[string]any
	Creds     map[string]*provider.Credential // provider → credential
	Providers map[string][]string             // provider → machine resource names
	// Buckets are the template's kloud_bucket claims (taken out of Files), their providers
	// resolved.
	Buckets []BucketSpec
}

// Templates resolves credentials and variables of a stack's files and checks them against the
// template policy (kloud/stacks.go build). Providers also are configured too (credentials
// resolved) though the files declare no machines of theirs: an update that removes all of a
// provider's machines.
type Templates interface {
	Template(ctx context.Context, c Caller, team string, files map[string][]byte, credIDs, vars map[string]string, also ...string) (*Built, error)
}

// Plans is kloud's plan of a stack's files, with the checks a plan makes (kloud/stacks.go plan).
type Plans interface {
	// PlanFiles plans files alone for stack st (no state: as stack.create plans a template,
	// with the template policy, the machine cap, the constraints and the quotas checked) and
	// returns the machines they declare (logf: terraform's lines, or nil).
	PlanFiles(ctx context.Context, c Caller, st *model.Stack, files []model.File, vars map[string]string, logf func(string)) ([]api.PlannedMachine, error)
	// PlanContext bounds a plan made for a call, not a job, by the plan timeout; PlanStopped
	// explains a plan its context stopped (the timeout, or the caller gone).
	PlanContext(ctx context.Context) (context.Context, context.CancelFunc)
	PlanStopped(ctx context.Context) error
}

// Quota holds the quotas of an owner and a team (kloud/quota.go): one check and the records it
// allows at a time. CheckBuckets refuses the bucket claims of st that would take its owner or
// team above its bucket quota (quota.Keeper.CheckBuckets).
type Quota interface {
	Hold(ctx context.Context, owner, team string) (release func(), err error)
	CheckBuckets(ctx context.Context, st *model.Stack, want []model.BucketClaim) error
}

// Machines is what the flow asks of kloud about machines.
type Machines interface {
	// ProviderMachine is the provider's view of m (c may be nil: m's owner).
	ProviderMachine(ctx context.Context, c Caller, m *model.Machine) (provider.Machine, error)
	// CanInfo reports whether the provider answers machine.info.
	CanInfo(provider string) bool
	// SetAgent records a machine's agent status (the one writer of it).
	SetAgent(ctx context.Context, kiteID, status, version string)
	// KeepPorts gives the machines of st the firewall rules kloud recorded for them, logging
	// on j what it could not.
	KeepPorts(ctx context.Context, j Job, st *model.Stack)
	// DeliverBuckets gives the running machines of st their stack's buckets (endpoint and the
	// owner's key, klient.setBuckets), logging on j what it could not.
	DeliverBuckets(ctx context.Context, j Job, st *model.Stack)
}

// Job is the running job a flow reports to (kloud's job context).
type Job interface {
	// Doc is the job's document as it was when the job started (id, owner, params).
	Doc() store.Job
	// Enter records that the job reached stage st.
	Enter(ctx context.Context, st Stage)
	// EnterAt records progress pct percent (0–100) through stage st.
	EnterAt(ctx context.Context, st Stage, pct int)
	// Logf adds a line to the job's log.
	Logf(ctx context.Context, format string, args ...any)
}

// Flow is the stack build flow: build, destroy, update, scale and reconcile.
type Flow struct {
	d   Deps
	log *slog.Logger
}

// New returns the flow over d.
func New(d Deps) *Flow {
	log := d.Log
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Flow{d: d, log: log}
}

// StackMachines returns the machines of stack stackID.
func (f *Flow) StackMachines(ctx context.Context, stackID string) ([]model.Machine, error) {
	return f.d.Store.Machines().ByStack(ctx, stackID)
}

// providerOf returns the provider called name, or nil.
func (f *Flow) providerOf(name string) *provider.Provider {
	p, _ := f.d.Providers.Lookup(name)
	return p
}

// stack reads stack id; a missing one is kite.ErrNotFound (as kloud's loadStack says it).
func (f *Flow) stack(ctx context.Context, id string) (*model.Stack, error) {
	st, err := f.d.Store.Stacks().Get(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("%s %q: %w", "stack", id, kite.ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	return &st, nil
}

// StackMachinesRetry is StackMachines for bookkeeping, and for the reads after terraform's work
// (a finished apply must not be lost to a store outage: TestStoreKilledMidJob): with its own
// context, retried (store.Store.Persist).
func (f *Flow) StackMachinesRetry(ctx context.Context, stackID string) ([]model.Machine, error) {
	var ms []model.Machine
	err := f.d.Store.Persist(ctx, "load machines of stack "+stackID, 0, func(ctx context.Context) error {
		var err error
		ms, err = f.StackMachines(ctx, stackID)
		return err
	})
	return ms, err
}

// SetStack changes a stack. It is bookkeeping: written with its own context and retried until
// the store has it (see store.Store.Persist), so a cancelled job still leaves an honest state.
func (f *Flow) SetStack(ctx context.Context, id string, set store.StackSet) {
	err := f.d.Store.Persist(ctx, "update stack "+id, 0, func(ctx context.Context) error {
		return f.d.Store.Stacks().Set(ctx, id, set)
	})
	if err != nil {
		f.log.ErrorContext(ctx, "update stack", "stack", id, "err", err)
	}
}

// SetMachine changes a machine; with from set, only if its state is one of them. Like SetStack
// it has its own context and retries.
func (f *Flow) SetMachine(ctx context.Context, id string, from []provider.State, set store.MachineSet) bool {
	if from == nil {
		err := f.d.Store.Persist(ctx, "update machine "+id, 0, func(ctx context.Context) error {
			return f.d.Store.Machines().Set(ctx, id, set)
		})
		if err != nil {
			f.log.ErrorContext(ctx, "update machine", "machine", id, "err", err)
		}
		return err == nil
	}
	fs := make([]string, len(from))
	for i, s := range from {
		fs[i] = string(s)
	}
	var ok bool
	err := f.d.Store.Persist(ctx, "update machine "+id, 0, func(ctx context.Context) error {
		var err error
		ok, err = f.d.Store.Machines().Transition(ctx, id, fs, set)
		return err
	})
	if err != nil {
		f.log.ErrorContext(ctx, "update machine", "machine", id, "err", err)
	}
	return ok
}

// SettledStates are the machine states no job is changing (not Building, Starting, Stopping or
// Terminating).
func SettledStates() []provider.State {
	var out []provider.State
	for _, st := range provider.States {
		if !st.InProgress() {
			out = append(out, st)
		}
	}
	return out
}

// StopTF cancels terraformer's run tfJob when the job's ctx was cancelled (a cancelled build
// or destroy must not leave terraform running), and waits until it stopped.
func (f *Flow) StopTF(ctx context.Context, tfJob string) {
	if tfJob == "" || ctx.Err() == nil {
		return
	}
	tf, err := f.d.Terraformer()
	if err != nil {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	if _, err := tf.Cancel(cctx, tfJob); err != nil && !errors.Is(err, kite.ErrState) {
		f.log.WarnContext(ctx, "cancel terraform run of a cancelled job", "tf_job", tfJob, "err", err)
	}
}

// SubmitTF submits a terraform run; while terraformer says the stack is locked (a run of an
// earlier attempt, e.g. before kloud restarted, still going) it waits and tries again. While
// terraformer is unavailable (kloud serve restarting it) it waits too, saying so in the job's
// log ("waiting for the terraformer (restarting)"), for up to TerraformerWait; then it fails
// with an error that says how long it waited.
func SubmitTF(ctx context.Context, j Job, submit func() (string, error)) (string, error) {
	said := false
	var w TFWait
	for {
		id, err := submit()
		if w.Retry(ctx, err, func(msg string) { j.Logf(ctx, "%s", msg) }) {
			continue
		}
		if w.Gave(err) {
			return "", w.Err(err)
		}
		if !errors.Is(err, kite.ErrConflict) {
			return id, err
		}
		if !said {
			j.Logf(ctx, "terraform is still busy with this stack (%v); waiting", err)
			said = true
		}
		select {
		case <-ctx.Done():
			return "", err
		case <-time.After(2 * time.Second):
		}
	}
}

// TerraformerWait bounds how long a job or call waits for an unavailable terraformer (kloud
// serve restarts a terraformer that died, with a backoff of up to 10s) before it fails. A start
// under way when it passes is waited for (the supervisor bounds a start: 2 minutes by default):
// on a loaded host a race-built terraformer took 30s to answer, and a call that gave up during
// that start failed although the new terraformer came up seconds later.
const TerraformerWait = time.Minute

// starting reports whether err says a new process is starting (internal/supervise's
// StartingError, as kloud serve's supervisor tells the terraformer client).
func starting(err error) bool {
	var s interface{ Starting() bool }
	return errors.As(err, &s) && s.Starting()
}

// TFWait is a terraformer call's wait for a terraformer that is unavailable (restarting): the
// zero value is ready; call Retry after every attempt.
type TFWait struct {
	// Max bounds the wait (0: TerraformerWait).
	Max   time.Duration
	since time.Time
	gave  error
}

func (w *TFWait) max() time.Duration {
	if w.Max > 0 {
		return w.Max
	}
	return TerraformerWait
}

// Retry reports whether the call that returned err should be made again: err says terraformer is
// unavailable or going away (TerraformerGone), ctx is live, and Max has not passed since the
// first such error (the first one is told to say, once) or err says a new terraformer is
// starting. It sleeps a moment before returning true. After the bound it returns false and
// Gave(err) holds: the caller returns err, which then says how long it waited.
func (w *TFWait) Retry(ctx context.Context, err error, say func(string)) bool {
	if !TerraformerGone(err) || ctx.Err() != nil {
		return false
	}
	if w.since.IsZero() {
		w.since = time.Now()
		if say != nil {
			say(fmt.Sprintf("waiting for the terraformer (restarting), up to %s: %v", w.max(), err))
		}
	}
	if time.Since(w.since) >= w.max() && !starting(err) {
		w.gave = err
		return false
	}
	select {
	case <-ctx.Done():
		return false
	case <-time.After(500 * time.Millisecond):
		return true
	}
}

// TerraformerGone reports whether err says the terraformer a call went to is going away or gone,
// so that the call is made again once the terraformer that replaces it answers: it is
// unavailable (restarting, or shutting down: its engine closed, which it answers with the
// unavailable code), or the connection closed during the call. A call that was refused (locked,
// invalid, not found) is not.
func TerraformerGone(err error) bool {
	return err != nil && (errors.Is(err, kite.ErrUnavailable) || errors.Is(err, kite.ErrClosed))
}

// Gave reports whether err is the error Retry gave up on; then the caller should return it
// wrapped by Err.
func (w *TFWait) Gave(err error) bool { return err != nil && err == w.gave }

// Err is err as a caller returns it once Retry gave up: it says how long it waited.
func (w *TFWait) Err(err error) error {
	if !w.Gave(err) {
		return err
	}
	return fmt.Errorf("terraformer did not come back within %s: %w", w.max(), err)
}

// RunDied reports whether a terraform run ended (err, from Wait or the run's Err) only because
// the process that ran it went away: terraformer was restarted or closed under it (also when
// kloud, its parent, was killed), or terraformer does not know the run. Terraform's apply and
// destroy converge on the state the run left, so such a run is started again.
func RunDied(err error) bool {
	var je *tfapi.JobError
	if errors.As(err, &je) {
		return je.Kind == tfapi.KindRestarted || je.Kind == tfapi.KindClosing
	}
	return errors.Is(err, kite.ErrNotFound)
}

// maxReruns bounds how often one job starts a terraform run again after it died (RunDied).
const maxReruns = 3

// FileMap is a stack's or template's files by name.
func FileMap(fs []model.File) map[string][]byte {
	out := make(map[string][]byte, len(fs))
	for _, f := range fs {
		out[f.Name] = []byte(f.Content)
	}
	return out
}
