package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// JobStatus is where a job is in its life: queued → running → succeeded | failed | cancelled.
type JobStatus string

// Job statuses.
const (
	JobQueued    JobStatus = "queued"
	JobRunning   JobStatus = "running"
	JobSucceeded JobStatus = "succeeded"
	JobFailed    JobStatus = "failed"
	JobCancelled JobStatus = "cancelled"
)

// Done reports whether the status is final.
func (st JobStatus) Done() bool {
	return st == JobSucceeded || st == JobFailed || st == JobCancelled
}

// MaxLogLine is the longest log line a job keeps; longer lines are cut and end in "…".
const MaxLogLine = 4096

// ErrJobCancelled, passed to [Jobs.Finish] (or context.Canceled), ends a job as cancelled.
var ErrJobCancelled = errors.New("job cancelled")

// Job is one long-running operation (stack apply, credential bootstrap, …) as stored in the
// jobs collection. Every change increments Rev.
type Job struct {
	ID     string `bson:"_id" json:"id"`
	Kind   string `bson:"kind" json:"kind"`                        // e.g. "stack.apply"
	Target string `bson:"target" json:"target"`                    // e.g. "stack/<id>"
	Owner  string `bson:"owner" json:"owner"`                      // username
	Params Doc    `bson:"params,omitempty" json:"params,omitzero"` // the call's parameters (the kind's typed params)

	Status  JobStatus `bson:"status" json:"status"`
	Percent int       `bson:"percent" json:"percentage"`
	Stage   string    `bson:"stage,omitempty" json:"stage,omitempty"` // progress status, e.g. "Building"
	Message string    `bson:"message,omitempty" json:"message,omitempty"`
	Error   string    `bson:"error,omitempty" json:"error,omitempty"`
	Result  Doc       `bson:"result,omitempty" json:"result,omitzero"` // the kind's typed result

	// Log holds the last Options.JobLogLines lines; LogSeq counts every line ever logged, so
	// Log[i] is line number LogSeq-len(Log)+i+1. See [Job.LogSince].
	Log    []string `bson:"log,omitempty" json:"log,omitempty"`
	LogSeq int64    `bson:"logSeq" json:"logSeq"`

	// Runner holds the job while LeaseUntil is in the future; Attempt counts Starts and
	// StartedAt is the latest one.
	Runner          string    `bson:"runner,omitempty" json:"runner,omitempty"`
	LeaseUntil      time.Time `bson:"leaseUntil,omitempty" json:"leaseUntil,omitzero"`
	Attempt         int       `bson:"attempt" json:"attempt"`
	CancelRequested bool      `bson:"cancelRequested,omitempty" json:"cancelRequested,omitempty"`

	Rev        int64     `bson:"rev" json:"rev"`
	CreatedAt  time.Time `bson:"createdAt" json:"createdAt"`
	UpdatedAt  time.Time `bson:"updatedAt" json:"updatedAt"`
	StartedAt  time.Time `bson:"startedAt,omitempty" json:"startedAt,omitzero"`
	FinishedAt time.Time `bson:"finishedAt,omitempty" json:"finishedAt,omitzero"`
}

// LogSince returns the kept log lines numbered after seq (1-based; 0 means all kept lines).
// Lines already dropped from the bounded log are not returned.
func (j Job) LogSince(seq int64) []string {
	first := j.LogSeq - int64(len(j.Log)) // number of the line before Log[0]
	if seq <= first {
		return j.Log
	}
	if seq >= j.LogSeq {
		return nil
	}
	return j.Log[seq-first:]
}

// normalize prepares a decoded job for callers: the log cut to the lines kept (the stored log
// may hold a few more on FerretDB, see Log).
func (js *Jobs) normalize(j *Job) {
	if max := js.s.opts.JobLogLines; len(j.Log) > max {
		j.Log = j.Log[len(j.Log)-max:]
	}
}

// plainMap turns the driver's bson.M, bson.D and bson.A inside m into map[string]any and []any
// (Doc.Map), so callers can type-assert nested values as they would after a JSON decode.
func plainMap(m map[string]any) map[string]any {
	for k, v := range m {
		m[k] = plainValue(v)
	}
	return m
}

func plainValue(v any) any {
	switch v := v.(type) {
	case bson.M:
		return plainMap(map[string]any(v))
	case map[string]any:
		return plainMap(v)
	case bson.A:
		return plainValue([]any(v))
	case []any:
		for i := range v {
			v[i] = plainValue(v[i])
		}
		return v
	case bson.D:
		m := make(map[string]any, len(v))
		for _, e := range v {
			m[e.Key] = plainValue(e.Value)
		}
		return m
	}
	return v
}

// JobFilter selects jobs for [Jobs.List]. Zero fields match everything.
type JobFilter struct {
	Target string
	Owner  string
	Kind   string
	Status []JobStatus
	Limit  int // default 100
}

// Jobs is the durable jobs API over the jobs collection. A job outlives the process that runs
// it: a runner holds it through a lease (Runner, LeaseUntil) kept alive by [Jobs.Heartbeat],
// [Jobs.Progress] and [Jobs.Log]; after a crash [Jobs.Orphans] finds it and the caller resumes
// it ([Jobs.Start] again) or fails it ([Jobs.Finish]).
type Jobs struct {
	s    *Store
	coll *mongo.Collection

	mu       sync.Mutex
	watchers map[string]map[*jobWatcher]struct{}
}

func newJobs(s *Store) *Jobs {
	return &Jobs{s: s, coll: s.Collection(CollJobs), watchers: map[string]map[*jobWatcher]struct{}{}}
}

// Create stores a new queued job and returns its id. Kind, Target and Owner are taken from
// j; so is ID if set (else a new one). All other fields are reset.
func (js *Jobs) Create(ctx context.Context, j Job) (string, error) {
	if j.Kind == "" || j.Target == "" {
		return "", errors.New("create job: kind and target are required")
	}
	now := js.s.Now()
	n := Job{
		ID: j.ID, Kind: j.Kind, Target: j.Target, Owner: j.Owner, Params: j.Params,
		Status: JobQueued, Rev: 1, CreatedAt: now, UpdatedAt: now,
	}
	if n.ID == "" {
		n.ID = NewID()
	}
	unlock := js.s.lockWrites()
	_, err := js.coll.InsertOne(ctx, n)
	unlock()
	if err != nil {
		if IsDuplicateKey(err) {
			return "", fmt.Errorf("create job %q: %w", n.ID, ErrConflict)
		}
		return "", fmt.Errorf("create job: %w", err)
	}
	js.publish(n)
	return n.ID, nil
}

// Get returns the job, or an error wrapping [ErrNotFound].
func (js *Jobs) Get(ctx context.Context, id string) (Job, error) {
	var j Job
	err := js.coll.FindOne(ctx, bson.M{"_id": id}).Decode(&j)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return Job{}, fmt.Errorf("job %q: %w", id, ErrNotFound)
	}
	if err != nil {
		return Job{}, fmt.Errorf("job %q: %w", id, err)
	}
	js.normalize(&j)
	return j, nil
}

// List returns jobs matching f, newest first.
func (js *Jobs) List(ctx context.Context, f JobFilter) ([]Job, error) {
	q := bson.M{}
	if f.Target != "" {
		q["target"] = f.Target
	}
	if f.Owner != "" {
		q["owner"] = f.Owner
	}
	if f.Kind != "" {
		q["kind"] = f.Kind
	}
	if len(f.Status) > 0 {
		q["status"] = bson.M{"$in": f.Status}
	}
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	return js.find(ctx, q, options.Find().SetSort(bson.D{{Key: "createdAt", Value: -1}, {Key: "_id", Value: -1}}).SetLimit(int64(limit)))
}

func (js *Jobs) find(ctx context.Context, q bson.M, opts ...options.Lister[options.FindOptions]) ([]Job, error) {
	cur, err := js.coll.Find(ctx, q, opts...)
	if err != nil {
		return nil, fmt.Errorf("list jobs: %w", err)
	}
	var out []Job
	if err := cur.All(ctx, &out); err != nil {
		return nil, fmt.Errorf("list jobs: %w", err)
	}
	for i := range out {
		js.normalize(&out[i])
	}
	return out, nil
}

// Start claims the job for runner: it moves a queued job to running, or takes over a running
// job whose runner lease expired or whose runner was an earlier process of this store's
// instance (a resume after a crash or a restart; Attempt counts these; see instance.go), or
// renews the claim if runner already holds it. A job held by another live runner gives an error wrapping
// [ErrLocked]; a finished job one wrapping [ErrState].
func (js *Jobs) Start(ctx context.Context, id, runner string) (Job, error) {
	if runner == "" {
		return Job{}, fmt.Errorf("start job %q: runner is required", id)
	}
	now := js.s.Now()
	dead := js.s.deadHolderFilter("runner") // an earlier process of this instance (instance.go)
	dead["status"] = JobRunning
	filter := bson.M{"_id": id, "$or": bson.A{
		bson.M{"status": JobQueued},
		bson.M{"status": JobRunning, "leaseUntil": bson.M{"$lt": now}},
		bson.M{"status": JobRunning, "runner": runner},
		dead,
	}}
	can := func(j *Job) bool {
		return j.Status == JobQueued || j.Status == JobRunning && (j.LeaseUntil.Before(now) || j.Runner == runner || js.s.EarlierProcess(j.Runner))
	}
	j, err := js.update(ctx, "start", id, filter, can, bson.M{
		"$set": bson.M{"status": JobRunning, "runner": runner, "leaseUntil": now.Add(js.s.opts.JobLeaseTTL),
			"startedAt": now, "updatedAt": now},
		"$inc": bson.M{"attempt": 1, "rev": 1},
	})
	if err != nil {
		return Job{}, err
	}
	return j.Job, nil
}

// Heartbeat extends runner's lease on a running job. It returns an error wrapping
// [ErrLeaseLost] if runner no longer holds the job (it was taken over, cancelled or finished):
// the runner must then stop. Heartbeats do not change Rev and do not wake watchers.
func (js *Jobs) Heartbeat(ctx context.Context, id, runner string) error {
	now := js.s.Now()
	ok, err := js.updateIf(ctx, id, bson.M{"_id": id, "status": JobRunning, "runner": runner},
		func(j *Job) bool { return j.Status == JobRunning && j.Runner == runner },
		bson.M{"$set": bson.M{"leaseUntil": now.Add(js.s.opts.JobLeaseTTL)}})
	if err != nil {
		return fmt.Errorf("heartbeat job %q: %w", id, err)
	}
	if !ok {
		return fmt.Errorf("heartbeat job %q by %q: %w", id, runner, ErrLeaseLost)
	}
	return nil
}

// Progress records a running job's percentage (clamped to 0..100), stage (the progress status,
// e.g. a machine state) and message, and extends the runner's lease.
func (js *Jobs) Progress(ctx context.Context, id string, percent int, stage, message string) error {
	return js.progress(ctx, id, "", percent, stage, message)
}

// ProgressRun is Progress by the runner that runs the job: an error wrapping [ErrState] and
// nothing written if the job is no longer runner's (taken over after its lease lapsed).
func (js *Jobs) ProgressRun(ctx context.Context, id, runner string, percent int, stage, message string) error {
	if runner == "" {
		return fmt.Errorf("progress job %q: runner is required", id)
	}
	return js.progress(ctx, id, runner, percent, stage, message)
}

func (js *Jobs) progress(ctx context.Context, id, runner string, percent int, stage, message string) error {
	percent = min(max(percent, 0), 100)
	now := js.s.Now()
	filter, can := bson.M{"_id": id, "status": JobRunning}, isRunning
	if runner != "" {
		filter["runner"] = runner
		can = func(j *Job) bool { return j.Status == JobRunning && j.Runner == runner }
	}
	_, err := js.update(ctx, "progress", id, filter, can, bson.M{
		"$set": bson.M{"percent": percent, "stage": stage, "message": message, "updatedAt": now,
			"leaseUntil": now.Add(js.s.opts.JobLeaseTTL)},
		"$inc": bson.M{"rev": 1},
	})
	return err
}

// Log appends lines to a queued or running job's log, keeping the last Options.JobLogLines,
// and extends a running job's lease. Lines longer than [MaxLogLine] bytes are cut. Every call
// rewrites the job document (on the embedded store ~15–25 ms once the log is full), so
// runners should batch lines, e.g. flush what arrived every few hundred milliseconds.
func (js *Jobs) Log(ctx context.Context, id string, lines ...string) error {
	if len(lines) == 0 {
		return nil
	}
	max, total := js.s.opts.JobLogLines, len(lines)
	clean := make([]string, 0, min(len(lines), max))
	if len(lines) > max {
		lines = lines[len(lines)-max:]
	}
	for _, l := range lines {
		// BSON strings must be UTF-8; tools' output is not always.
		l = strings.ToValidUTF8(l, "\uFFFD")
		if len(l) > MaxLogLine {
			cut := MaxLogLine - len("…")
			for cut > 0 && !utf8.RuneStart(l[cut]) {
				cut--
			}
			l = l[:cut] + "…"
		}
		clean = append(clean, l)
	}
	now := js.s.Now()
	j, err := js.update(ctx, "log", id, bson.M{"_id": id, "status": bson.M{"$in": bson.A{JobQueued, JobRunning}}}, notDone, bson.M{
		// MongoDB honours $slice; FerretDB v1 ignores it, hence the trim below.
		"$push": bson.M{"log": bson.M{"$each": clean, "$slice": -max}},
		"$inc":  bson.M{"rev": 1, "logSeq": total},
		"$set":  bson.M{"updatedAt": now, "leaseUntil": now.Add(js.s.opts.JobLeaseTTL)},
	})
	if err != nil {
		return err
	}
	if j.storedLog > max+max/4 {
		// FerretDB: cut the stored log back to max lines, if nothing changed since (else the
		// next Log does it). Reads always cut to max, so the slack only saves rewrites of the
		// whole document: one trim per max/4 lines instead of one per call. Trimming changes
		// no line numbers, so Rev stays.
		rev := j.Rev
		if _, err := js.updateIf(ctx, id, bson.M{"_id": id, "rev": rev}, func(j *Job) bool { return j.Rev == rev },
			bson.M{"$set": bson.M{"log": j.Log}}); err != nil {
			return fmt.Errorf("log job %q: trim: %w", id, err)
		}
	}
	return nil
}

// Finish ends a queued or running job: succeeded if err is nil, cancelled if err wraps
// context.Canceled or [ErrJobCancelled], failed otherwise with err's text. result is stored as
// is (a zero Doc: none). Finishing a finished job returns an error wrapping [ErrState].
func (js *Jobs) Finish(ctx context.Context, id string, jobErr error, result Doc) error {
	return js.finish(ctx, id, "", jobErr, result)
}

// FinishRun is Finish by the runner that runs the job: it changes nothing and returns an error
// wrapping [ErrLeaseLost] if the job is no longer runner's (another replica took it over after
// runner's lease lapsed, and runs or ran it): a runner that stalled past its lease never
// overwrites the outcome of the run that replaced it.
func (js *Jobs) FinishRun(ctx context.Context, id, runner string, jobErr error, result Doc) error {
	if runner == "" {
		return fmt.Errorf("finish job %q: runner is required", id)
	}
	return js.finish(ctx, id, runner, jobErr, result)
}

// finish is Finish; with a runner, only while runner runs the job.
func (js *Jobs) finish(ctx context.Context, id, runner string, jobErr error, result Doc) error {
	now := js.s.Now()
	set := bson.M{"updatedAt": now, "finishedAt": now}
	switch {
	case jobErr == nil:
		set["status"], set["percent"] = JobSucceeded, 100
	case errors.Is(jobErr, context.Canceled) || errors.Is(jobErr, ErrJobCancelled):
		set["status"], set["error"] = JobCancelled, jobErr.Error()
	default:
		set["status"], set["error"] = JobFailed, jobErr.Error()
	}
	if !result.IsZero() {
		set["result"] = result
	}
	filter, can := bson.M{"_id": id, "status": bson.M{"$in": bson.A{JobQueued, JobRunning}}}, notDone
	if runner != "" {
		filter = bson.M{"_id": id, "status": JobRunning, "runner": runner}
		can = func(j *Job) bool { return j.Status == JobRunning && j.Runner == runner }
	}
	cur, err := js.update(ctx, "finish", id, filter, can, bson.M{"$set": set, "$inc": bson.M{"rev": 1}})
	if runner != "" && errors.Is(err, ErrState) && cur.Runner != runner {
		return fmt.Errorf("finish job %q by %q: it is %s, run by %q: %w", id, runner, cur.Status, cur.Runner, ErrLeaseLost)
	}
	return err
}

// RequestCancel cancels a queued job at once, or marks a running one CancelRequested; its
// runner sees that through [Jobs.Watch] or [Jobs.Get], stops, and calls Finish with
// [ErrJobCancelled]. It returns the job as updated.
func (js *Jobs) RequestCancel(ctx context.Context, id string) (Job, error) {
	now := js.s.Now()
	j, err := js.update(ctx, "cancel", id, bson.M{"_id": id, "status": JobQueued}, isQueued, bson.M{
		"$set": bson.M{"status": JobCancelled, "error": ErrJobCancelled.Error(), "updatedAt": now, "finishedAt": now},
		"$inc": bson.M{"rev": 1},
	})
	if !errors.Is(err, ErrState) {
		return j.Job, err
	}
	j, err = js.update(ctx, "cancel", id, bson.M{"_id": id, "status": JobRunning}, isRunning, bson.M{
		"$set": bson.M{"cancelRequested": true, "updatedAt": now},
		"$inc": bson.M{"rev": 1},
	})
	return j.Job, err
}

// Orphans returns the jobs nobody is running at time now: running jobs whose runner lease
// expired before now or whose runner was an earlier process of this store's instance (see
// instance.go; Start takes those at once), and queued jobs created more than Options.JobLeaseTTL before now (their
// creator died before starting them). At startup the caller resumes each (Start) or fails it
// (Finish).
func (js *Jobs) Orphans(ctx context.Context, now time.Time) ([]Job, error) {
	dead := js.s.deadHolderFilter("runner")
	dead["status"] = JobRunning
	return js.find(ctx, bson.M{"$or": bson.A{
		bson.M{"status": JobRunning, "leaseUntil": bson.M{"$lt": now}},
		dead, // held by an earlier process of this instance, which is gone (instance.go)
		bson.M{"status": JobQueued, "createdAt": bson.M{"$lt": now.Add(-js.s.opts.JobLeaseTTL)}},
	}}, options.Find().SetSort(bson.D{{Key: "createdAt", Value: 1}}))
}

// Conditions of job updates, as Go predicates for the embedded backend (see updateIf).
func isQueued(j *Job) bool  { return j.Status == JobQueued }
func isRunning(j *Job) bool { return j.Status == JobRunning }
func notDone(j *Job) bool   { return !j.Status.Done() }

// updateIf applies upd to job id if it matches: on MongoDB, one conditional update with filter;
// on the embedded backend, under the store's write lock, a read by _id, can checked in Go, and
// the update by _id (every write of the jobs collection is made here and takes that lock, so
// this is as atomic as the filter; see Store.lockWrites). can must test what filter tests. It
// reports whether the job matched and, if after is given, decodes the updated job into it.
func (js *Jobs) updateIf(ctx context.Context, id string, filter bson.M, can func(*Job) bool, upd bson.M, after ...*Job) (bool, error) {
	opts := options.FindOneAndUpdate().SetReturnDocument(options.After)
	if js.s.embedded != nil {
		unlock := js.s.lockWrites()
		defer unlock()
		var cur Job
		err := js.coll.FindOne(ctx, bson.M{"_id": id}).Decode(&cur)
		if errors.Is(err, mongo.ErrNoDocuments) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if !can(&cur) {
			return false, nil
		}
		filter = bson.M{"_id": id}
	}
	res := js.coll.FindOneAndUpdate(ctx, filter, upd, opts)
	var j Job
	target := &j
	if len(after) > 0 {
		target = after[0]
	}
	err := res.Decode(target)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return true, nil
}

// updatedJob is a job as returned by update, with the length of its log as stored.
type updatedJob struct {
	Job
	storedLog int
}

// update applies one conditional update (updateIf), publishes the new state to watchers and
// returns it. If the job does not match, it tells not-found from wrong-state.
func (js *Jobs) update(ctx context.Context, op, id string, filter bson.M, can func(*Job) bool, upd bson.M) (updatedJob, error) {
	var j Job
	ok, err := js.updateIf(ctx, id, filter, can, upd, &j)
	if err != nil {
		return updatedJob{}, fmt.Errorf("%s job %q: %w", op, id, err)
	}
	if !ok {
		cur, gerr := js.Get(ctx, id)
		if gerr != nil {
			return updatedJob{}, fmt.Errorf("%s job: %w", op, gerr)
		}
		if op == "start" && cur.Status == JobRunning {
			return updatedJob{Job: cur}, fmt.Errorf("start job %q: held by runner %q until %s: %w",
				id, cur.Runner, cur.LeaseUntil.Format(time.RFC3339Nano), ErrLocked)
		}
		return updatedJob{Job: cur}, fmt.Errorf("%s job %q: job is %s: %w", op, id, cur.Status, ErrState)
	}
	n := len(j.Log)
	js.normalize(&j)
	js.publish(j)
	return updatedJob{Job: j, storedLog: n}, nil
}

// jobWatcher queues snapshots for one Watch without ever blocking the publisher.
type jobWatcher struct {
	mu      sync.Mutex
	pending []Job
	wake    chan struct{} // cap 1
}

func (w *jobWatcher) push(j Job) {
	w.mu.Lock()
	w.pending = append(w.pending, j)
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (w *jobWatcher) take() []Job {
	w.mu.Lock()
	defer w.mu.Unlock()
	p := w.pending
	w.pending = nil
	return p
}

func (js *Jobs) publish(j Job) {
	js.s.changed(Change{Coll: CollJobs, ID: j.ID, Job: &j})
	js.mu.Lock()
	defer js.mu.Unlock()
	for w := range js.watchers[j.ID] {
		w.push(j)
	}
}

// Watch streams the job's states: first the current one, then every change this process makes
// (each one, in order), and whatever a re-read every Options.JobPollInterval finds, so changes
// made by another process or replica are seen too (those may skip intermediate states).
// States only move forward (by Rev). The channel closes after the final state (succeeded,
// failed or cancelled) was delivered, or when ctx ends or the store closes; the caller must
// keep reading or cancel ctx.
func (js *Jobs) Watch(ctx context.Context, id string) (<-chan Job, error) {
	w := &jobWatcher{wake: make(chan struct{}, 1)}
	js.mu.Lock()
	if js.watchers[id] == nil {
		js.watchers[id] = map[*jobWatcher]struct{}{}
	}
	js.watchers[id][w] = struct{}{}
	js.mu.Unlock()
	unregister := func() {
		js.mu.Lock()
		delete(js.watchers[id], w)
		if len(js.watchers[id]) == 0 {
			delete(js.watchers, id)
		}
		js.mu.Unlock()
	}
	// Registered before the first read, so no change between the two is missed.
	first, err := js.Get(ctx, id)
	if err != nil {
		unregister()
		return nil, fmt.Errorf("watch: %w", err)
	}
	out := make(chan Job)
	go func() {
		defer close(out)
		defer unregister()
		tick := time.NewTicker(js.s.opts.JobPollInterval)
		defer tick.Stop()
		var last int64
		send := func(j Job) (stop bool) {
			if j.Rev <= last {
				return false
			}
			select {
			case out <- j:
			case <-ctx.Done():
				return true
			case <-js.s.closed:
				return true
			}
			last = j.Rev
			return j.Status.Done()
		}
		if send(first) {
			return
		}
		for {
			select {
			case <-ctx.Done():
				return
			case <-js.s.closed:
				return
			case <-w.wake:
				for _, j := range w.take() {
					if send(j) {
						return
					}
				}
			case <-tick.C:
				j, err := js.Get(ctx, id)
				if err != nil {
					if ctx.Err() == nil {
						js.s.log.Warn("watch job: poll", "job_id", id, "err", err)
					}
					if errors.Is(err, ErrNotFound) {
						return // pruned
					}
					continue
				}
				// Deliver queued in-process states first, so nothing is skipped by the poll.
				for _, q := range w.take() {
					if send(q) {
						return
					}
				}
				if send(j) {
					return
				}
			}
		}
	}()
	return out, nil
}
