package kloud

import (
	"context"
	"errors"
	"fmt"
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

// jobCtx is a running job.
type jobCtx struct {
	store.Job
	s        *Server
	progress *store.ProgressWriter // coalesces Progress (see newJobCtx)
}

// newJobCtx returns the running job's context. Its progress updates are coalesced: at most one
// write every store.DefaultProgressInterval, at once on a new step (stage or message) or at
// 100%, and the last one is always written before the job is finished (runJob flushes it).
func (s *Server) newJobCtx(j store.Job) *jobCtx {
	jc := &jobCtx{Job: j, s: s}
	jc.progress = store.NewProgressWriter(0, func(ctx context.Context, p store.Progress) error {
		return s.store.Persist(ctx, "progress job "+j.ID, jobNoteTimeout, func(ctx context.Context) error {
			return s.store.Jobs().Progress(ctx, j.ID, p.Percent, p.Stage, p.Message)
		})
	})
	return jc
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
		j.s.log.WarnContext(ctx, "job progress", "job", j.ID, "err", err)
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
	err := j.s.store.Persist(ctx, "log job "+j.ID, jobNoteTimeout, func(ctx context.Context) error {
		return j.s.store.Jobs().Log(ctx, j.ID, line)
	})
	if err != nil {
		j.s.log.WarnContext(ctx, "job log", "job", j.ID, "line", line, "err", err)
	}
}

type jobRunner struct {
	mu      sync.Mutex
	cancels map[string]context.CancelFunc
	wg      sync.WaitGroup
	base    context.Context
}

// startJob creates the job spec on target for owner, with id ("": a new one), and runs it in the
// background. It returns the job's id. Jobs are started through their kind (jobKind.Start).
func (s *Server) startJob(ctx context.Context, id string, spec jobSpec, target, owner string) (string, error) {
	k, ok := s.kinds[spec.kind]
	if !ok {
		return "", fmt.Errorf("unknown job kind %q", spec.kind)
	}
	id, err := s.store.Jobs().Create(ctx, store.Job{ID: id, Kind: spec.kind, Target: target, Owner: owner, Params: spec.params})
	if err != nil {
		return "", fmt.Errorf("create job: %w", err)
	}
	j, err := s.store.Jobs().Start(ctx, id, s.store.InstanceID())
	if err != nil {
		return "", fmt.Errorf("start job: %w", err)
	}
	s.runJob(j, k, false)
	return id, nil
}

func (s *Server) runner() *jobRunner {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.jobs == nil {
		s.jobs = &jobRunner{cancels: map[string]context.CancelFunc{}, base: context.Background()}
	}
	return s.jobs
}

// runJob runs job j of kind k (recovering: resumed after its runner died) in the background.
func (s *Server) runJob(j store.Job, k anyJobKind, recovering bool) {
	r := s.runner()
	ctx, cancel := context.WithCancel(r.base)
	r.mu.Lock()
	r.cancels[j.ID] = cancel
	r.mu.Unlock()
	r.wg.Add(1)
	s.metrics.jobStarted(j.Kind) // metrics.go
	started := time.Now()
	go func() {
		defer r.wg.Done()
		defer func() {
			cancel()
			r.mu.Lock()
			delete(r.cancels, j.ID)
			r.mu.Unlock()
		}()
		log := s.log.With("job", j.ID, "kind", j.Kind, "target", j.Target)
		// The heartbeat lasts until the job function returns, not until its context ends: a
		// cancelled job's failure bookkeeping (stopping terraform, retried writes) can take a
		// while, and the job must not look orphaned meanwhile.
		hctx, stopHeartbeat := context.WithCancel(context.WithoutCancel(ctx))
		go s.heartbeat(hctx, j.ID, cancel)
		var res store.Doc
		jc := s.newJobCtx(j)
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
		ferr := s.store.Persist(ctx, "finish job "+j.ID, 0, func(ctx context.Context) error {
			return s.store.Jobs().Finish(ctx, j.ID, err, res)
		})
		if ferr != nil {
			// The job stays running with a lapsing lease: recovery or the reconciler resolves it.
			log.Error("finish job", "err", ferr)
		}
		s.metrics.jobEnded(j.Kind, err, time.Since(started))
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
func (s *Server) heartbeat(ctx context.Context, id string, cancelJob context.CancelFunc) {
	lease := s.opts.JobLease
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
			err := s.store.Jobs().Heartbeat(ctx, id, s.store.InstanceID())
			switch {
			case ctx.Err() != nil:
				return
			case errors.Is(err, store.ErrLeaseLost):
				s.log.WarnContext(ctx, "job taken over or ended elsewhere; stopping it here", "job", id, "err", err)
				cancelJob()
			case err != nil:
				s.log.WarnContext(ctx, "job heartbeat", "job", id, "err", err)
			default:
				if j, err := s.store.Jobs().Get(ctx, id); err == nil && j.CancelRequested {
					cancelJob()
				}
			}
		}
	}
}

// recoverJobs resolves jobs whose runner died: it claims each (so one replica does it) and lets
// its kind resume or fail it.
func (s *Server) recoverJobs(ctx context.Context) {
	orphans, err := s.store.Jobs().Orphans(ctx, s.store.Now())
	if err != nil {
		s.log.ErrorContext(ctx, "find interrupted jobs", "err", err)
		return
	}
	r := s.runner()
	for _, o := range orphans {
		r.mu.Lock()
		_, running := r.cancels[o.ID]
		r.mu.Unlock()
		if running {
			continue // ours, still running: its lease lapsed (a stall), it is not orphaned
		}
		j, err := s.store.Jobs().Start(ctx, o.ID, s.store.InstanceID())
		if err != nil {
			continue // another replica took it
		}
		k, ok := s.kinds[j.Kind]
		if !ok {
			k = unknownJobKind(j.Kind)
		}
		s.log.InfoContext(ctx, "recovering interrupted job", "job", j.ID, "kind", j.Kind, "attempt", j.Attempt)
		s.runJob(j, k, true)
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
func (s *Server) WaitJobs() { s.runner().wg.Wait() }

// runJobsLoop recovers interrupted jobs and reconciles stuck states at start, then every few
// seconds (jobs) and every ReconcileInterval (states), until ctx ends.
func (s *Server) runJobsLoop(ctx context.Context) {
	s.recoverJobs(ctx)
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
			s.recoverJobs(ctx)
		case <-rt.C:
			s.reconcile(ctx)
		}
	}
}

func (s *Server) loadJob(ctx context.Context, c *Caller, id string) (store.Job, error) {
	j, err := s.store.Jobs().Get(ctx, id)
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

func (s *Server) jobGet(ctx context.Context, c *Caller, _ *kite.Request, p *api.JobRef) (api.Job, error) {
	j, err := s.loadJob(ctx, c, p.JobID)
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

func (s *Server) jobList(ctx context.Context, c *Caller, _ *kite.Request, p *api.JobListParams) (api.JobListResult, error) {
	f := store.JobFilter{Target: p.Target, Limit: p.Limit}
	if !c.Admin {
		f.Owner = c.Username
	}
	if f.Limit <= 0 || f.Limit > 200 {
		f.Limit = 50
	}
	jobs, err := s.store.Jobs().List(ctx, f)
	if err != nil {
		return api.JobListResult{}, err
	}
	return api.JobListResult{Jobs: apiJobs(jobs)}, nil
}

func (s *Server) jobCancel(ctx context.Context, c *Caller, _ *kite.Request, p *api.JobRef) (api.Job, error) {
	if _, err := s.loadJob(ctx, c, p.JobID); err != nil {
		return api.Job{}, err
	}
	j, err := s.store.Jobs().RequestCancel(ctx, p.JobID)
	if err != nil {
		return api.Job{}, err
	}
	r := s.runner()
	r.mu.Lock()
	if cancel := r.cancels[p.JobID]; cancel != nil {
		cancel()
	}
	r.mu.Unlock()
	return apiJob(j), nil
}

func (s *Server) jobWatch(ctx context.Context, c *Caller, r *kite.Request, p *api.JobRef) (api.JobWatchResult, error) {
	j, err := s.loadJob(ctx, c, p.JobID)
	if err != nil {
		return api.JobWatchResult{}, err
	}
	stream := r.Conn.NewStream("job.event")
	ch, err := s.store.Jobs().Watch(stream.Context(), p.JobID)
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
