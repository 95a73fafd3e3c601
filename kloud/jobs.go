package kloud

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"sync"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/stackbuild"
	"github.com/kloud-dev/kloud/kloud/store"
)

// Durable jobs: every long call (stack apply, machine start/stop, credential bootstrap) creates a
// job in the store and returns its id at once; the work runs here, holding the job's runner lease
// (renewed by every progress update and a heartbeat). When kloud restarts, jobs whose runner is
// gone are handed to their kind's recover function, which resumes them or fails them with a
// reason and puts machines back into an honest state. A job's bookkeeping (its log, progress,
// final states, Finish) is written with a context of its own and retried (store.Store.Persist),
// so a cancelled job still records how it ended; what a crash leaves anyway is found by the
// reconciler (reconcile.go).

// jobKind is one kind of job, with params P and result R: how it runs and how it recovers. Its
// params and result are stored as documents (store.EncodeDoc: P and R under their JSON names,
// which job.get shows); a job is started through its kind (Start), so its params are P or the
// call does not compile. The kinds are listed in routes.go (Server.jobKinds).
type jobKind[P, R any] struct {
	name string // e.g. "stack.apply"
	run  func(ctx context.Context, j *jobCtx, p P) (R, error)
	// recover resolves a job whose runner died (nil: fail it with a reason).
	recover func(ctx context.Context, j *jobCtx, p P) (R, error)
}

// anyJobKind is a jobKind of any params and result, as the table of kinds holds it.
type anyJobKind interface {
	kindName() string
	// runDoc decodes j's params, runs the job (recovering: resumes it after its runner died) and
	// encodes its result.
	runDoc(ctx context.Context, j *jobCtx, recovering bool) (store.Doc, error)
}

// checkedParams are params that check themselves once decoded from a job (a job whose document
// was not made by its kind, or is damaged, fails with the reason instead of running with zero
// values).
type checkedParams interface{ Validate() error }

func (k jobKind[P, R]) kindName() string { return k.name }

func (k jobKind[P, R]) runDoc(ctx context.Context, j *jobCtx, recovering bool) (store.Doc, error) {
	fn := k.run
	if recovering {
		if fn = k.recover; fn == nil {
			return store.Doc{}, errors.New("kloud restarted while this job ran; run it again")
		}
	}
	var p P
	if err := j.Params.Decode(&p); err != nil {
		return store.Doc{}, fmt.Errorf("%s job params: %w", k.name, err)
	}
	if c, ok := any(&p).(checkedParams); ok {
		if err := c.Validate(); err != nil {
			return store.Doc{}, err
		}
	}
	r, err := fn(ctx, j, p)
	if reflect.ValueOf(&r).Elem().IsZero() {
		return store.Doc{}, err // no result (the kinds return one on success)
	}
	doc, derr := store.EncodeDoc(r)
	if derr != nil {
		return store.Doc{}, errors.Join(err, fmt.Errorf("%s job result: %w", k.name, derr))
	}
	return doc, err
}

// jobSpec is a job ready to start: its kind and its params as a document (jobKind.spec).
type jobSpec struct {
	kind   string
	params store.Doc
}

// spec is a job of kind k with params p, to start (Server.startJob).
func (k jobKind[P, R]) spec(p P) (jobSpec, error) {
	d, err := store.EncodeDoc(p)
	if err != nil {
		return jobSpec{}, fmt.Errorf("%s job params: %w", k.name, err)
	}
	return jobSpec{kind: k.name, params: d}, nil
}

// Start creates a job of kind k with params p on target for owner and runs it in the
// background. It returns the job's id.
func (k jobKind[P, R]) Start(ctx context.Context, s *Server, target, owner string, p P) (string, error) {
	return k.StartID(ctx, s, "", target, owner, p)
}

// StartID is Start with the job's id chosen by the caller ("": a new one), so the id can be
// recorded on the job's target in the same update that claims it.
func (k jobKind[P, R]) StartID(ctx context.Context, s *Server, id, target, owner string, p P) (string, error) {
	spec, err := k.spec(p)
	if err != nil {
		return "", err
	}
	return s.startJob(ctx, id, spec, target, owner)
}

// jobCtx is a running job: what its kind's functions get.
type jobCtx struct {
	store.Job
	s        *Server // what the kinds run on (set by jobRunner.bind)
	store    *store.Store
	log      *slog.Logger
	progress *store.ProgressWriter // coalesces Progress (see jobRunner.newJobCtx)
}

// jobNoteTimeout bounds the retries of one progress update or log line: they are written even
// when the job's context is cancelled (the lines that say why it failed matter most), but a
// store that stays down must not hold the job up for long.
const jobNoteTimeout = 15 * time.Second

// Progress records the job's percentage, stage (a state name) and message. It is written with
// its own context (see [Store.Persist]), so a cancelled job still records where it ended.
// Updates are coalesced (store.ProgressWriter): a burst of them makes a few writes.
func (j *jobCtx) Progress(ctx context.Context, percent int, stage, message string) {
	if err := j.progress.Set(ctx, store.Progress{Percent: percent, Stage: stage, Message: message}); err != nil {
		j.log.WarnContext(ctx, "job progress", "job", j.ID, "err", err)
	}
	j.Percent, j.Stage, j.Message = percent, stage, message
}

// Enter records that the job reached stage st: its percentage, state and message come from
// stackbuild's stage table.
func (j *jobCtx) Enter(ctx context.Context, st stackbuild.Stage) {
	j.Progress(ctx, st.Percent(), string(st.State()), string(st))
}

// EnterAt records progress pct percent (0–100) through stage st (terraform's own progress).
func (j *jobCtx) EnterAt(ctx context.Context, st stackbuild.Stage, pct int) {
	j.Progress(ctx, st.Within(pct), string(st.State()), string(st))
}

// Logf adds a line to the job's log, with its own context like Progress.
func (j *jobCtx) Logf(ctx context.Context, format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	err := j.store.Persist(ctx, "log job "+j.ID, jobNoteTimeout, func(ctx context.Context) error {
		return j.store.Jobs().Log(ctx, j.ID, line)
	})
	if err != nil {
		j.log.WarnContext(ctx, "job log", "job", j.ID, "line", line, "err", err)
	}
}

// jobRunner runs the durable jobs of this kloud (their runner leases, heartbeats, cancels, the
// recovery of jobs whose runner died) and serves job.get, job.list, job.cancel and job.watch.
// New builds the one of a Server (Server.jobs); jobs start through Server.startJob.
type jobRunner struct {
	store   *store.Store // jobs, their retried writes, this runner's instance id
	log     *slog.Logger
	metrics jobMetrics
	kinds   map[string]anyJobKind // the kinds it runs (Server.jobKinds, routes.go)
	lease   time.Duration         // Options.JobLease: the heartbeat renews it every third
	// bind gives a running job what its kind runs on (jobCtx.s: the server whose handlers do
	// the jobs' work).
	bind func(*jobCtx)

	mu      sync.Mutex
	cancels map[string]context.CancelFunc // the running jobs of this process
	wg      sync.WaitGroup
}

// jobMetrics counts jobs (kloudMetrics, metrics.go).
type jobMetrics interface {
	jobStarted(kind string)
	jobEnded(kind string, err error, d time.Duration)
}

// startJob creates the job spec on target for owner, with id ("": a new one), and runs it in the
// background. It returns the job's id. Jobs are started through their kind (jobKind.Start).
func (s *Server) startJob(ctx context.Context, id string, spec jobSpec, target, owner string) (string, error) {
	return s.jobs.start(ctx, id, spec, target, owner)
}

// start is Server.startJob.
func (r *jobRunner) start(ctx context.Context, id string, spec jobSpec, target, owner string) (string, error) {
	k, ok := r.kinds[spec.kind]
	if !ok {
		return "", fmt.Errorf("unknown job kind %q", spec.kind)
	}
	id, err := r.store.Jobs().Create(ctx, store.Job{ID: id, Kind: spec.kind, Target: target, Owner: owner, Params: spec.params})
	if err != nil {
		return "", fmt.Errorf("create job: %w", err)
	}
	j, err := r.store.Jobs().Start(ctx, id, r.store.InstanceID())
	if err != nil {
		return "", fmt.Errorf("start job: %w", err)
	}
	r.run(j, k, false)
	return id, nil
}

// newJobCtx returns the running job's context. Its progress updates are coalesced: at most one
// write every store.DefaultProgressInterval, at once on a new step (stage or message) or at
// 100%, and the last one is always written before the job is finished (run flushes it).
func (r *jobRunner) newJobCtx(j store.Job) *jobCtx {
	jc := &jobCtx{Job: j, store: r.store, log: r.log}
	r.bind(jc)
	jc.progress = store.NewProgressWriter(0, func(ctx context.Context, p store.Progress) error {
		return r.store.Persist(ctx, "progress job "+j.ID, jobNoteTimeout, func(ctx context.Context) error {
			return r.store.Jobs().ProgressRun(ctx, j.ID, j.Runner, p.Percent, p.Stage, p.Message)
		})
	})
	return jc
}

// running reports whether job id runs in this process.
func (r *jobRunner) running(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.cancels[id]
	return ok
}

// run runs job j of kind k (recovering: resumed after its runner died) in the background.
func (r *jobRunner) run(j store.Job, k anyJobKind, recovering bool) {
	ctx, cancel := context.WithCancel(context.Background())
	r.mu.Lock()
	if r.cancels == nil {
		r.cancels = map[string]context.CancelFunc{}
	}
	r.cancels[j.ID] = cancel
	r.mu.Unlock()
	r.wg.Add(1)
	r.metrics.jobStarted(j.Kind) // metrics.go
	started := time.Now()
	go func() {
		defer r.wg.Done()
		defer func() {
			cancel()
			r.mu.Lock()
			delete(r.cancels, j.ID)
			r.mu.Unlock()
		}()
		log := r.log.With("job", j.ID, "kind", j.Kind, "target", j.Target)
		// The heartbeat lasts until the job function returns, not until its context ends: a
		// cancelled job's failure bookkeeping (stopping terraform, retried writes) can take a
		// while, and the job must not look orphaned meanwhile.
		hctx, stopHeartbeat := context.WithCancel(context.WithoutCancel(ctx))
		go r.heartbeat(hctx, j.ID, cancel)
		var res store.Doc
		jc := r.newJobCtx(j)
		err := func() (err error) {
			defer func() {
				if p := recover(); p != nil {
					err = fmt.Errorf("internal error: %v", p)
				}
			}()
			res, err = k.runDoc(ctx, jc, recovering)
			return err
		}()
		// The last progress value is written before the job is finished.
		jc.progress.Stop()
		if perr := jc.progress.Flush(ctx); perr != nil {
			log.Warn("job progress", "err", perr)
		}
		stopHeartbeat()
		ferr := r.store.Persist(ctx, "finish job "+j.ID, 0, func(ctx context.Context) error {
			return r.store.Jobs().FinishRun(ctx, j.ID, j.Runner, err, res)
		})
		if errors.Is(ferr, store.ErrLeaseLost) {
			// Another replica took the job over (this one stalled past its lease): its run's
			// outcome stands, not this one's.
			log.Warn("job taken over by another runner; its outcome is the other run's", "err", ferr, "this_run_err", err)
		} else if ferr != nil {
			// The job stays running with a lapsing lease: recovery or the reconciler resolves it.
			log.Error("finish job", "err", ferr)
		}
		r.metrics.jobEnded(j.Kind, err, time.Since(started))
		if err != nil {
			log.Info("job failed", "err", err)
		} else {
			log.Info("job done")
		}
	}()
}

// heartbeat keeps the job's runner lease until ctx ends. It stops the job (cancelJob) when a
// cancel was requested through another kloud (job.cancel only reaches the runner's context in
// the process that got the call) or when this process lost the job to another runner.
func (r *jobRunner) heartbeat(ctx context.Context, id string, cancelJob context.CancelFunc) {
	lease := r.lease
	if lease <= 0 {
		lease = 30 * time.Second
	}
	t := time.NewTicker(lease / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			err := r.store.Jobs().Heartbeat(ctx, id, r.store.InstanceID())
			switch {
			case ctx.Err() != nil:
				return
			case errors.Is(err, store.ErrLeaseLost):
				r.log.WarnContext(ctx, "job taken over or ended elsewhere; stopping it here", "job", id, "err", err)
				cancelJob()
			case err != nil:
				r.log.WarnContext(ctx, "job heartbeat", "job", id, "err", err)
			default:
				if j, err := r.store.Jobs().Get(ctx, id); err == nil && j.CancelRequested {
					cancelJob()
				}
			}
		}
	}
}

// recoverOrphans resolves jobs whose runner died: it claims each (so one replica does it) and
// lets its kind resume or fail it.
func (r *jobRunner) recoverOrphans(ctx context.Context) {
	orphans, err := r.store.Jobs().Orphans(ctx, r.store.Now())
	if err != nil {
		r.log.ErrorContext(ctx, "find interrupted jobs", "err", err)
		return
	}
	for _, o := range orphans {
		if r.running(o.ID) {
			continue // ours, still running: its lease lapsed (a stall), it is not orphaned
		}
		j, err := r.store.Jobs().Start(ctx, o.ID, r.store.InstanceID())
		if err != nil {
			continue // another replica took it
		}
		k, ok := r.kinds[j.Kind]
		if !ok {
			k = unknownJobKind(j.Kind)
		}
		r.log.InfoContext(ctx, "recovering interrupted job", "job", j.ID, "kind", j.Kind, "attempt", j.Attempt)
		r.run(j, k, true)
	}
}

// unknownJobKind is a kind this kloud does not run (a job of an older or newer kloud): an
// interrupted job of it fails with a reason.
type unknownJobKind string

func (k unknownJobKind) kindName() string { return string(k) }

func (k unknownJobKind) runDoc(context.Context, *jobCtx, bool) (store.Doc, error) {
	return store.Doc{}, errors.New("kloud restarted while this job ran; run it again")
}

// WaitJobs waits for running jobs to end (tests, shutdown).
func (s *Server) WaitJobs() { s.jobs.wg.Wait() }

// runJobsLoop recovers interrupted jobs and reconciles stuck states at start, then every few
// seconds (jobs) and every ReconcileInterval (states), until ctx ends.
func (s *Server) runJobsLoop(ctx context.Context) {
	s.jobs.recoverOrphans(ctx)
	// Then stacks and machines left in a transitional state by jobs that are over
	// (reconcile.go): recovered jobs are running again by now, so they are left alone.
	s.reconcile(ctx)
	// Later orphans (a replica that died while we run, or our own from before a restart
	// whose lease had not yet expired) are picked up periodically, and so are stuck states.
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	rt := time.NewTicker(s.reconcileInterval())
	defer rt.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.jobs.recoverOrphans(ctx)
		case <-rt.C:
			s.reconcile(ctx)
			s.reconcilePools(ctx) // pools.go
		case <-s.poolKick:
			s.reconcilePools(ctx)
		}
	}
}

// load is job id if c may see it (its owner, or a kloud admin); not found otherwise.
func (r *jobRunner) load(ctx context.Context, c *Caller, id string) (store.Job, error) {
	j, err := r.store.Jobs().Get(ctx, id)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return j, notFound("job", id)
		}
		return j, err
	}
	if j.Owner != c.Username && !c.Admin {
		return j, notFound("job", id)
	}
	return j, nil
}

// get serves job.get.
func (r *jobRunner) get(ctx context.Context, c *Caller, _ *kite.Request, p *api.JobRef) (api.Job, error) {
	j, err := r.load(ctx, c, p.JobID)
	if err != nil {
		return api.Job{}, err
	}
	return apiJob(j), nil
}

// apiJob is a stored job as the API shows it (the same JSON).
func apiJob(j store.Job) api.Job {
	return api.Job{
		ID: j.ID, Kind: j.Kind, Target: j.Target, Owner: j.Owner, Params: j.Params.Map(),
		Status: api.JobStatus(j.Status), Percent: j.Percent, Stage: j.Stage, Message: j.Message, Error: j.Error, Result: j.Result.Map(),
		Log: j.Log, LogSeq: j.LogSeq,
		Runner: j.Runner, LeaseUntil: j.LeaseUntil, Attempt: j.Attempt, CancelRequested: j.CancelRequested,
		Rev: j.Rev, CreatedAt: j.CreatedAt, UpdatedAt: j.UpdatedAt, StartedAt: j.StartedAt, FinishedAt: j.FinishedAt,
	}
}

func apiJobs(js []store.Job) []api.Job {
	out := make([]api.Job, len(js))
	for i, j := range js {
		out[i] = apiJob(j)
	}
	return out
}

// list serves job.list: the caller's jobs (a kloud admin's: everyone's), newest first, 50 or
// the limit asked (at most 200).
func (r *jobRunner) list(ctx context.Context, c *Caller, _ *kite.Request, p *api.JobListParams) (api.JobListResult, error) {
	f := store.JobFilter{Target: p.Target, Limit: p.Limit}
	if !c.Admin {
		f.Owner = c.Username
	}
	if f.Limit <= 0 || f.Limit > 200 {
		f.Limit = 50
	}
	jobs, err := r.store.Jobs().List(ctx, f)
	if err != nil {
		return api.JobListResult{}, err
	}
	return api.JobListResult{Jobs: apiJobs(jobs)}, nil
}

// cancel serves job.cancel: the request is recorded (a runner in another kloud sees it at its
// heartbeat) and a job running here is cancelled at once.
func (r *jobRunner) cancel(ctx context.Context, c *Caller, _ *kite.Request, p *api.JobRef) (api.Job, error) {
	if _, err := r.load(ctx, c, p.JobID); err != nil {
		return api.Job{}, err
	}
	j, err := r.store.Jobs().RequestCancel(ctx, p.JobID)
	if err != nil {
		return api.Job{}, err
	}
	r.mu.Lock()
	if cancel := r.cancels[p.JobID]; cancel != nil {
		cancel()
	}
	r.mu.Unlock()
	return apiJob(j), nil
}

// watch serves job.watch: the job now, and its changes as job.event notifications on a stream.
func (r *jobRunner) watch(ctx context.Context, c *Caller, req *kite.Request, p *api.JobRef) (api.JobWatchResult, error) {
	j, err := r.load(ctx, c, p.JobID)
	if err != nil {
		return api.JobWatchResult{}, err
	}
	stream := req.Conn.NewStream("job.event")
	ch, err := r.store.Jobs().Watch(stream.Context(), p.JobID)
	if err != nil {
		stream.End(ctx, err)
		return api.JobWatchResult{}, err
	}
	go func() {
		var seq int64
		for cur := range ch {
			ev := api.JobEvent{ID: cur.ID, Status: api.JobStatus(cur.Status), Percentage: cur.Percent, Stage: cur.Stage, Message: cur.Message,
				Log: cur.LogSince(seq), Error: cur.Error}
			seq = cur.LogSeq
			if cur.Status.Done() {
				ev.Result = cur.Result.Map()
			}
			sctx, cancel := context.WithTimeout(stream.Context(), 10*time.Second)
			err := stream.Send(sctx, ev)
			cancel()
			if err != nil {
				return
			}
		}
		stream.End(context.Background(), nil)
	}()
	return api.JobWatchResult{Subscription: stream.ID(), Job: apiJob(j)}, nil
}
