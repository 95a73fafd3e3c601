// Package tfpool is a pool of terraformers as kloud uses one: [Pool] implements kloud.Terraformer
// over several terraformer processes (one tfclient.Client each) that keep their stacks and jobs
// in one shared directory (terraformer's --shared-dir). plan, apply and destroy go to the live
// member with the fewest runs this pool started there (ties in turn); Wait, Cancel, State and
// Outputs go to the member that took the job, and to another live one when it is gone. Since the
// directory is shared, any member answers for any job and any stack: the state, files and
// variables of a stack are in one place, a member's engine follows a job that another process
// runs by its job file, and when that process dies the job is marked failed with
// tfapi.KindRestarted (at once on the same host, where the dead pid is seen; after the lease TTL,
// default 30s, on another host), which kloud's stackbuild.RunDied takes as "run it again": the
// next submit lands on a live member. Two runs on one stack never overlap: the stack's lease
// (tfrun's lease.json under an flock in the shared directory) refuses the second with
// kite.ErrConflict.
//
// A member whose directory is not the pool's (its /healthz poolId differs from the one the pool
// saw first; within one round of checks, the first in Options.Members order) is never used: a job
// it ran would be invisible to the others, and a stack it built would look unbuilt to them.
//
// Start reading at [New] and [Pool.Apply]; [Pool.Wait] is the takeover.
package tfpool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	tfjson "github.com/hashicorp/terraform-json"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/terraformer/tfapi"
	"github.com/kloud-dev/kloud/terraformer/tfclient"
)

// Options configure New. Zero fields get the defaults in their comments.
type Options struct {
	// Members are the terraformers, one client each (required, at least one). The pool sets each
	// client's WaitDown to FailoverAfter and closes them in Close.
	Members []*tfclient.Client
	// CheckInterval is how often every member's /healthz and /readyz are asked. Default: 2s.
	CheckInterval time.Duration
	// FailoverAfter is how long a Wait waits for its member to come back before it follows the
	// job on another live member. Default: 5s.
	FailoverAfter time.Duration
	// WaitDown bounds how long Wait waits while no member is live. Default: 2m (tfclient's).
	WaitDown time.Duration
	// Logger receives the pool's logs. Default: discard.
	Logger *slog.Logger
}

// Pool spreads terraform work over its members; see the package doc.
type Pool struct {
	opts    Options
	log     *slog.Logger
	members []*member
	cancel  context.CancelFunc
	done    chan struct{}

	mu     sync.Mutex
	jobs   map[string]*member // jobs this pool started or followed, until they are final
	turn   int                // round robin among the least busy
	poolID string             // the shared directory's id: the first answering member's (Options order)
}

type member struct {
	c *tfclient.Client

	// under Pool.mu
	checked bool  // a health check finished
	healthy bool  // it answered /readyz ready
	why     error // why it is not healthy, or foreign
	foreign bool  // its directory is not the pool's
	busy    int   // runs this pool started on it, not yet seen final
}

// New starts the pool's health checks; Close stops them.
func New(o Options) (*Pool, error) {
	if len(o.Members) == 0 {
		return nil, errors.New("tfpool: no members")
	}
	if o.CheckInterval <= 0 {
		o.CheckInterval = 2 * time.Second
	}
	if o.FailoverAfter <= 0 {
		o.FailoverAfter = 5 * time.Second
	}
	if o.WaitDown <= 0 {
		o.WaitDown = 2 * time.Minute
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Pool{opts: o, log: o.Logger, cancel: cancel, done: make(chan struct{}), jobs: map[string]*member{}}
	for _, c := range o.Members {
		c.WaitDown = o.FailoverAfter
		p.members = append(p.members, &member{c: c})
	}
	go p.check(ctx)
	return p, nil
}

// Close stops the health checks and closes the members' clients. Jobs keep running.
func (p *Pool) Close() error {
	p.cancel()
	<-p.done
	var errs []error
	for _, m := range p.members {
		errs = append(errs, m.c.Close())
	}
	return errors.Join(errs...)
}

// URLs are the members' kite URLs, in the order of Options.Members.
func (p *Pool) URLs() []string {
	out := make([]string, len(p.members))
	for i, m := range p.members {
		out[i] = m.c.URL()
	}
	return out
}

// Member is what the pool knows of one member now (Members).
type Member struct {
	URL string `json:"url"`
	// Live: it may be given work (its last health check passed, or none finished yet).
	Live bool `json:"live"`
	// Busy counts the runs this pool started on it that it has not yet seen end.
	Busy int `json:"busy"`
	// Error says why it is not live (down, not ready, or not of this pool's directory).
	Error string `json:"error,omitempty"`
}

// Members is the state of every member, in the order of Options.Members.
func (p *Pool) Members() []Member {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]Member, len(p.members))
	for i, m := range p.members {
		out[i] = Member{URL: m.c.URL(), Live: p.liveLocked(m), Busy: m.busy}
		if u := m.c.Unavailable(); u != nil {
			out[i].Error = u.Error()
		} else if !out[i].Live && m.why != nil {
			out[i].Error = m.why.Error()
		}
	}
	return out
}

// check asks every member's health every CheckInterval until ctx ends. The answers of one round
// are applied in the members' order, so that the pool's directory is the one of the first member
// in Options.Members that answered, not of whichever answered fastest.
func (p *Pool) check(ctx context.Context) {
	defer close(p.done)
	for {
		res := make([]health, len(p.members))
		var wg sync.WaitGroup
		for i, m := range p.members {
			wg.Go(func() { res[i] = p.ask(ctx, m) })
		}
		wg.Wait()
		if ctx.Err() != nil {
			return
		}
		for i, m := range p.members {
			p.apply(m, res[i])
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(p.opts.CheckInterval):
		}
	}
}

// health is one answer of a member's /healthz, or why there was none.
type health struct {
	h   tfapi.Health
	err error
}

// ask asks m's health, bounded by the check interval (at least 2s).
func (p *Pool) ask(ctx context.Context, m *member) health {
	cctx, cancel := context.WithTimeout(ctx, max(p.opts.CheckInterval, 2*time.Second))
	defer cancel()
	h, err := m.c.Health(cctx)
	if err == nil && !h.Readiness.Ready {
		err = fmt.Errorf("not ready: %s", strings.Join(h.Readiness.NotReady, ", "))
	}
	return health{h: h, err: err}
}

// apply records one answer of m: live, down, or foreign (its directory is not the pool's). The
// first answer with a pool id sets the pool's.
func (p *Pool) apply(m *member, r health) {
	h, err := r.h, r.err
	p.mu.Lock()
	defer p.mu.Unlock()
	was := m.checked && m.healthy
	m.checked, m.healthy, m.why = true, err == nil, err
	if err == nil && len(p.members) > 1 {
		wasForeign := m.foreign
		switch {
		case h.PoolID == "":
			m.foreign, m.why = true, errors.New("its /healthz names no pool id (a terraformer older than the pool): not used")
		case p.poolID == "":
			p.poolID = h.PoolID
		case h.PoolID != p.poolID:
			m.foreign, m.why = true, fmt.Errorf("its directory is pool %s, not the pool's %s: start every member with one --shared-dir", h.PoolID, p.poolID)
		default:
			m.foreign = false
		}
		if m.foreign {
			m.healthy = false
			if !wasForeign {
				p.log.Error("terraformer refused by the pool", "url", m.c.URL(), "err", m.why)
			}
			return
		}
	}
	if was != m.healthy {
		if m.healthy {
			p.log.Info("terraformer of the pool is live", "url", m.c.URL())
		} else {
			p.log.Warn("terraformer of the pool is down", "url", m.c.URL(), "err", err)
		}
	}
}

// liveLocked reports whether m may be given work: not marked down by its supervisor, and its
// last health check (if any finished) said ready.
func (p *Pool) liveLocked(m *member) bool {
	if m.foreign || m.c.Unavailable() != nil {
		return false
	}
	return !m.checked || m.healthy
}

// pick returns the live member with the fewest runs, not in skip; nil if none.
func (p *Pool) pick(skip map[*member]bool) *member {
	p.mu.Lock()
	defer p.mu.Unlock()
	var best *member
	n := len(p.members)
	for i := range n {
		m := p.members[(p.turn+i)%n]
		if skip[m] || !p.liveLocked(m) {
			continue
		}
		if best == nil || m.busy < best.busy {
			best = m
		}
	}
	p.turn++
	return best
}

// down marks m not healthy until its next health check says otherwise.
func (p *Pool) down(m *member, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	m.checked, m.healthy, m.why = true, false, err
}

// noneLive is the error of a call no member could take.
func (p *Pool) noneLive(last error) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var why []string
	for _, m := range p.members {
		cause := m.why
		if u := m.c.Unavailable(); u != nil {
			cause = u
		}
		if cause == nil {
			cause = errors.New("unreachable")
		}
		why = append(why, m.c.URL()+": "+cause.Error())
	}
	if last != nil {
		return fmt.Errorf("no terraformer of the pool took the call (%s): %w", strings.Join(why, "; "), last)
	}
	return &tfclient.UnavailableError{Cause: fmt.Errorf("no terraformer of the pool is live (%s)", strings.Join(why, "; "))}
}

// Unavailable returns nil while some member is live, else why none is (kloud's readiness).
func (p *Pool) Unavailable() error {
	p.mu.Lock()
	for _, m := range p.members {
		if p.liveLocked(m) {
			p.mu.Unlock()
			return nil
		}
	}
	p.mu.Unlock()
	return p.noneLive(nil)
}

// Health is the health of the first live member (kloud doctor), its URL that member's.
func (p *Pool) Health(ctx context.Context) (tfapi.Health, error) {
	m := p.pick(nil)
	if m == nil {
		return tfapi.Health{}, p.noneLive(nil)
	}
	return m.c.Health(ctx)
}

// gone reports whether err says the member a call went to is down or went away.
func gone(err error) bool {
	return err != nil && (errors.Is(err, kite.ErrUnavailable) || errors.Is(err, kite.ErrClosed))
}

// Plan starts `terraform plan` on a live member.
func (p *Pool) Plan(ctx context.Context, req tfapi.Request) (string, error) {
	return p.submit(ctx, req, (*tfclient.Client).Plan)
}

// Apply starts `terraform apply` on the live member with the fewest runs. A stack that a run
// on any member holds is an error wrapping kite.ErrConflict, as with one terraformer.
func (p *Pool) Apply(ctx context.Context, req tfapi.Request) (string, error) {
	return p.submit(ctx, req, (*tfclient.Client).Apply)
}

// Destroy starts `terraform destroy` on a live member; without Files it uses the stack's stored
// files, which every member sees.
func (p *Pool) Destroy(ctx context.Context, req tfapi.Request) (string, error) {
	return p.submit(ctx, req, (*tfclient.Client).Destroy)
}

// submit tries the live members, least busy first, until one takes the run or refuses it for a
// reason other than being down. A submit whose connection broke may have started a run on the
// member that broke: the stack's lease keeps the next member's run from overlapping it
// (kite.ErrConflict, which stackbuild.SubmitTF waits out).
func (p *Pool) submit(ctx context.Context, req tfapi.Request, fn func(*tfclient.Client, context.Context, tfapi.Request) (string, error)) (string, error) {
	tried := map[*member]bool{}
	var last error
	for {
		m := p.pick(tried)
		if m == nil {
			return "", p.noneLive(last)
		}
		id, err := fn(m.c, ctx, req)
		if err == nil {
			p.mu.Lock()
			m.busy++
			p.jobs[id] = m
			p.mu.Unlock()
			p.log.Debug("terraform run submitted", "job_id", id, "content_id", req.ContentID, "terraformer", m.c.URL())
			return id, nil
		}
		if !gone(err) || ctx.Err() != nil {
			return "", err
		}
		p.down(m, err)
		tried[m], last = true, err
	}
}

// finished forgets job id (final, or cancelled).
func (p *Pool) finished(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if m := p.jobs[id]; m != nil {
		m.busy = max(m.busy-1, 0)
		delete(p.jobs, id)
	}
}

// memberOf is the member that took job id, if this pool knows it.
func (p *Pool) memberOf(id string) *member {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.jobs[id]
}

// Wait follows the job to its end on the member that took it. When that member is gone for
// FailoverAfter, it follows the job on another live member, which reads it from the shared
// directory: a job whose process died is final there with tfapi.KindRestarted (see the package
// doc), which the caller runs again. While no member is live it waits up to WaitDown.
func (p *Pool) Wait(ctx context.Context, jobID string, fn func(tfapi.Event)) (*tfapi.Job, error) {
	m := p.memberOf(jobID)
	var noneSince time.Time
	for {
		if m == nil {
			if m = p.pick(nil); m == nil {
				if noneSince.IsZero() {
					noneSince = time.Now()
				}
				if time.Since(noneSince) > p.opts.WaitDown {
					return nil, fmt.Errorf("wait for job %s: %w", jobID, p.noneLive(nil))
				}
				select {
				case <-ctx.Done():
					return nil, fmt.Errorf("wait for job %s: %w", jobID, ctx.Err())
				case <-time.After(500 * time.Millisecond):
				}
				continue
			}
		}
		noneSince = time.Time{}
		j, err := m.c.Wait(ctx, jobID, fn)
		if !gone(err) || ctx.Err() != nil {
			if j != nil && j.Status.Final() {
				p.finished(jobID)
			}
			return j, err
		}
		p.log.Warn("terraformer gone while following a job: following it on another", "job_id", jobID, "terraformer", m.c.URL(), "err", err)
		p.down(m, err)
		m = nil
	}
}

// Cancel stops the job on the member that runs it. A member that does not run it refuses with
// kite.ErrState while the job is not final; the others are asked then.
func (p *Pool) Cancel(ctx context.Context, jobID string) (*tfapi.Job, error) {
	first := p.memberOf(jobID)
	order := []*member{}
	if first != nil {
		order = append(order, first)
	}
	for _, m := range p.members {
		if m != first {
			order = append(order, m)
		}
	}
	var last error
	for _, m := range order {
		p.mu.Lock()
		live := p.liveLocked(m)
		p.mu.Unlock()
		if !live {
			continue
		}
		j, err := m.c.Cancel(ctx, jobID)
		if err == nil {
			p.finished(jobID)
			return j, nil
		}
		last = err
		switch {
		case errors.Is(err, kite.ErrState):
			// Final (then that is the answer), or another member's run.
			if cur, jerr := m.c.Job(ctx, jobID); jerr == nil && cur.Status.Final() {
				p.finished(jobID)
				return nil, err
			}
		case gone(err):
			p.down(m, err)
		default:
			return nil, err
		}
	}
	if last == nil {
		return nil, p.noneLive(nil)
	}
	return nil, last
}

// State is the stack's state, from any live member (the state is in the shared directory).
func (p *Pool) State(ctx context.Context, contentID string) (*tfjson.State, error) {
	var st *tfjson.State
	err := p.read(ctx, func(c *tfclient.Client) (err error) {
		st, err = c.State(ctx, contentID)
		return err
	})
	return st, err
}

// Outputs are the stack's root module outputs, from any live member.
func (p *Pool) Outputs(ctx context.Context, contentID string) (map[string]any, error) {
	var out map[string]any
	err := p.read(ctx, func(c *tfclient.Client) (err error) {
		out, err = c.Outputs(ctx, contentID)
		return err
	})
	return out, err
}

// read runs fn on live members until one answers (or refuses for a reason other than being down).
func (p *Pool) read(ctx context.Context, fn func(*tfclient.Client) error) error {
	tried := map[*member]bool{}
	var last error
	for {
		m := p.pick(tried)
		if m == nil {
			return p.noneLive(last)
		}
		err := fn(m.c)
		if !gone(err) || ctx.Err() != nil {
			return err
		}
		p.down(m, err)
		tried[m], last = true, err
	}
}

// Job is the job as the member that took it (or any live member) has it now.
func (p *Pool) Job(ctx context.Context, jobID string) (*tfapi.Job, error) {
	if m := p.memberOf(jobID); m != nil {
		if j, err := m.c.Job(ctx, jobID); !gone(err) {
			return j, err
		}
	}
	var j *tfapi.Job
	err := p.read(ctx, func(c *tfclient.Client) (err error) {
		j, err = c.Job(ctx, jobID)
		return err
	})
	return j, err
}
