package terraformer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/terraformer/tfrun"
)

// Options configure a Service. Zero fields get the defaults in their comments.
type Options struct {
	// Engine runs the jobs. Required.
	Engine *tfrun.Engine
	// Kite gets the terraformer.* methods. Required; its identity's name must be "terraformer",
	// and its Authenticator should be NewAuthenticator's (the service only checks who the
	// authenticated caller is, not how).
	Kite *kite.Kite
	// KloudUsers are the only subjects allowed to call terraformer. Default: ["kloud"].
	KloudUsers []string
	// Logger receives the service's logs. Default: discard.
	Logger *slog.Logger
}

// Service serves Terraform runs over the kite protocol. Its methods are registered on the kite
// by New; the service has no lifecycle of its own (close the kite, then the engine).
type Service struct {
	engine *tfrun.Engine
	kite   *kite.Kite
	users  []string
	log    *slog.Logger
	pumps  sync.WaitGroup // watch streams being fed
}

// New registers the terraformer.* methods on opts.Kite.
func New(opts Options) (*Service, error) {
	if opts.Engine == nil {
		return nil, errors.New("terraformer: Options.Engine is required")
	}
	if opts.Kite == nil {
		return nil, errors.New("terraformer: Options.Kite is required")
	}
	if n := opts.Kite.Identity().Name; n != Name {
		return nil, fmt.Errorf("terraformer: the kite is named %q, want %q", n, Name)
	}
	if len(opts.KloudUsers) == 0 {
		opts.KloudUsers = []string{"kloud"}
	}
	if slices.Contains(opts.KloudUsers, "") {
		return nil, errors.New("terraformer: an empty username in Options.KloudUsers")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Service{engine: opts.Engine, kite: opts.Kite, users: slices.Clone(opts.KloudUsers), log: opts.Logger}
	for op, method := range map[tfrun.Op]string{tfrun.OpPlan: MethodPlan, tfrun.OpApply: MethodApply, tfrun.OpDestroy: MethodDestroy} {
		s.handle(method, kite.Typed(func(ctx context.Context, r *kite.Request, p *Request) (any, error) {
			return s.submit(ctx, r, op, p)
		}))
	}
	s.handle(MethodJob, kite.Typed(s.job))
	s.handle(MethodWatch, kite.Typed(s.watch))
	// Cancel waits for terraform to stop: up to CancelGrace after SIGINT, then SIGKILL.
	s.handle(MethodCancel, kite.Typed(s.cancel), kite.WithTimeout(opts.Engine.Options().CancelGrace+time.Minute))
	s.handle(MethodState, kite.Typed(s.state))
	s.handle(MethodOutputs, kite.Typed(s.outputs))
	return s, nil
}

// handle registers h behind the permission check and the error mapping.
func (s *Service) handle(method string, h kite.Handler, opts ...kite.MethodOption) {
	s.kite.Handle(method, kite.HandlerFunc(func(ctx context.Context, r *kite.Request) (any, error) {
		if err := s.authorize(r); err != nil {
			s.log.Warn("call refused", "method", method, "username", r.Username(), "err", err)
			return nil, err
		}
		res, err := h.ServeKite(ctx, r)
		if err != nil {
			return nil, toKite(err)
		}
		return res, nil
	}), opts...)
}

// authorize admits kite keys, and tokens for this kite (the authenticator checked the audience),
// whose subject is one of the kloud users.
func (s *Service) authorize(r *kite.Request) error {
	p := r.Principal()
	if p == nil {
		return fmt.Errorf("%s: not authenticated: %w", r.Method, kite.ErrAuth)
	}
	if p.Type != kite.AuthKiteKey && p.Type != kite.AuthToken {
		return fmt.Errorf("%s: terraformer accepts kloud's kite key or a token for this kite, not a %s credential: %w",
			r.Method, p.Type, kite.ErrPermission)
	}
	if !slices.Contains(s.users, p.Username) {
		return fmt.Errorf("%s: user %q may not use terraformer (only %v): %w", r.Method, p.Username, s.users, kite.ErrPermission)
	}
	return nil
}

func (s *Service) submit(ctx context.Context, r *kite.Request, op tfrun.Op, p *Request) (any, error) {
	j, err := s.engine.Submit(ctx, engineRequest(p, op))
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", op, p.ContentID, err)
	}
	s.log.Info("job accepted", "job_id", j.ID, "op", op, "content_id", p.ContentID, "trace_id", p.TraceID,
		"username", r.Username(), "files", len(p.Files))
	return SubmitResult{JobID: j.ID}, nil
}

func (s *Service) job(_ context.Context, _ *kite.Request, p *JobParams) (any, error) {
	return s.engine.Job(p.JobID)
}

// watch opens a terraformer.event stream of the job. The stream lives as long as the connection
// (or until the client unsubscribes), not as long as this call.
func (s *Service) watch(_ context.Context, r *kite.Request, p *JobParams) (any, error) {
	wctx, cancel := context.WithCancel(r.Conn.Context())
	events, err := s.engine.Watch(wctx, p.JobID)
	if err != nil {
		cancel()
		return nil, err
	}
	st := r.Conn.NewStream(EventMethod)
	s.pumps.Go(func() { s.pump(cancel, st, events) })
	return WatchResult{Subscription: st.ID()}, nil
}

// pump forwards the engine's events to the stream and ends the stream after the final event,
// with the job's error if it did not succeed.
func (s *Service) pump(cancel context.CancelFunc, st *kite.Stream, events <-chan tfrun.Event) {
	defer cancel()
	end := func(err error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		st.End(ctx, err) //nolint:errcheck // the client is gone or will see the connection drop
	}
	for {
		select {
		case <-st.Done(): // unsubscribed or disconnected
			return
		case ev, ok := <-events:
			if !ok {
				end(fmt.Errorf("watch ended before the job did: %w", kite.ErrClosed))
				return
			}
			if err := st.Send(st.Context(), ev); err != nil {
				if errors.Is(err, kite.ErrTooLarge) {
					end(err)
				}
				return
			}
			if ev.Type == tfrun.EventFinal {
				end(jobError(ev.Job))
				return
			}
		}
	}
}

// Drain waits until every watch stream has ended, or ctx is done. Streams end after their job's
// final event, so closing the engine and then draining, before closing the kite, lets watchers
// learn how their jobs ended at shutdown.
func (s *Service) Drain(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		s.pumps.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("drain watch streams: %w", ctx.Err())
	}
}

func (s *Service) cancel(ctx context.Context, r *kite.Request, p *JobParams) (any, error) {
	err := s.engine.Cancel(ctx, p.JobID)
	if err != nil && !errors.Is(err, ctx.Err()) {
		return nil, err
	}
	// Either the job stopped, or the call's deadline passed while it is still stopping (it will):
	// either way the caller gets the job as it is now.
	s.log.Info("job cancelled", "job_id", p.JobID, "username", r.Username())
	return s.engine.Job(p.JobID)
}

func (s *Service) state(ctx context.Context, _ *kite.Request, p *ContentParams) (any, error) {
	st, err := s.engine.State(ctx, p.ContentID)
	if err != nil {
		return nil, err
	}
	return StateResult{ContentID: p.ContentID, State: st}, nil
}

func (s *Service) outputs(ctx context.Context, _ *kite.Request, p *ContentParams) (any, error) {
	out, err := s.engine.Outputs(ctx, p.ContentID)
	if err != nil {
		return nil, err
	}
	return OutputsResult{ContentID: p.ContentID, Outputs: out}, nil
}

// coded is an error that keeps its message and gains a kite error code.
type coded struct {
	err  error
	code *kite.Error
}

func (c *coded) Error() string   { return c.err.Error() }
func (c *coded) Unwrap() []error { return []error{c.err, c.code} }

// toKite maps the engine's sentinels to kite codes; errors that already carry one keep it.
func toKite(err error) error {
	var ke *kite.Error
	if errors.As(err, &ke) {
		return err
	}
	switch {
	case errors.Is(err, tfrun.ErrLocked):
		return &coded{err, kite.ErrConflict}
	case errors.Is(err, tfrun.ErrNotFound):
		return &coded{err, kite.ErrNotFound}
	case errors.Is(err, tfrun.ErrInvalid):
		return &coded{err, kite.ErrInvalidParams}
	case errors.Is(err, tfrun.ErrState):
		return &coded{err, kite.ErrState}
	case errors.Is(err, tfrun.ErrClosed):
		// Going away, not refusing: unavailable, so that a caller waits for the terraformer
		// that replaces this one (kloud's stackbuild.TFWait) instead of failing.
		return &coded{fmt.Errorf("terraformer is shutting down: %w", err), kite.ErrUnavailable}
	}
	return err
}

// jobError is the error a watch stream ends with: nil for a job that succeeded.
func jobError(j *tfrun.Job) error {
	if j == nil || j.Status == tfrun.StatusSucceeded {
		return nil
	}
	je := j.Error
	if je == nil {
		je = &tfrun.JobError{Kind: tfrun.KindInternal, Message: "job " + string(j.Status)}
	}
	e := &kite.Error{Code: kite.CodeState, Message: fmt.Sprintf("job %s %s: %s", j.ID, j.Status, je.Message),
		Data: &kite.ErrorData{Type: "badState", Details: je}}
	switch je.Kind {
	case tfrun.KindCancelled, tfrun.KindClosing:
		e.Code, e.Data.Type = kite.CodeTimeout, "cancelled"
	case tfrun.KindHung:
		e.Code, e.Data.Type = kite.CodeTimeout, "timeout"
	}
	return e
}
