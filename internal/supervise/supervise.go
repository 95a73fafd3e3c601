// Package supervise runs a child process and keeps it running: kloud serve's terraformer and its
// S3 server (objstore/seaweed) are supervised so. Start at Process: Start runs the process and
// waits until Health says it answers; afterwards every exit is logged with its cause and the
// process started again after a backoff, until Stop.
package supervise

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os/exec"
	"runtime"
	"sync"
	"syscall"
	"time"
)

// Process is one supervised child process. When it exits it is started again after a backoff
// (100 ms, doubling up to 10 s; back to 100 ms once it served 10 s), each exit and restart
// logged with its cause. While it is down, OnDown has been told why; OnUp is called once the new
// process answers.
//
// The child gets SIGTERM from the kernel when its parent dies, even by SIGKILL (Pdeathsig; it
// is started on a locked OS thread that lives until the child has exited, since Pdeathsig
// follows the thread, not the process).
//
// Messages and logs name it by Name: "terraformer (pid 12) exited (signal: killed)".
type Process struct {
	// Name names the process in errors and logs ("terraformer").
	Name string
	Bin  string
	Args []string
	// Env, if not nil, is the child's environment (nil: this process's). Dir, if set, is its
	// working directory.
	Env []string
	Dir string
	// URL is where it answers: shown in messages and logs, and (with Health nil) asked for
	// URL+"/healthz".
	URL string
	// Health reports whether the process answers (nil: GET URL/healthz answers 200 with HTTP).
	// It is called every 100 ms while the process starts, with a context that ends within 2 s.
	Health func(ctx context.Context) bool
	// HTTP asks /healthz when Health is nil (nil: net/http's default client).
	HTTP *http.Client
	Out  io.Writer    // the child's stdout and stderr (nil: discarded)
	Log  *slog.Logger // nil: discarded
	// OnDown and OnUp, if set, are called when the process goes down (cause says why and when
	// it comes back) and when a restarted process answers.
	OnDown func(cause error)
	OnUp   func()

	// Defaults: 100ms, 10s, DefaultResetAfter (10s), 2m, 20s. StartTimeout is long because a
	// process that is starting is not yet broken: on a loaded 2-core host a race-built
	// terraformer took over 30s to answer (CI), and kloud serve gave up.
	MinBackoff, MaxBackoff time.Duration
	// ResetAfter: a process that served this long since it answered is not crash-looping, so
	// the restart after its exit waits MinBackoff again (a process killed now and then, a
	// minute apart, must not wait ever longer).
	ResetAfter   time.Duration
	StartTimeout time.Duration // a start must answer Health within this
	StopGrace    time.Duration // SIGTERM, then SIGKILL after this

	mu       sync.Mutex
	pid      int
	restarts int
	stopc    chan struct{}
	done     chan struct{}
	stopOnce sync.Once
}

func (s *Process) defaults() {
	if s.MinBackoff <= 0 {
		s.MinBackoff = 100 * time.Millisecond
	}
	if s.MaxBackoff <= 0 {
		s.MaxBackoff = 10 * time.Second
	}
	if s.ResetAfter <= 0 {
		s.ResetAfter = DefaultResetAfter
	}
	if s.StartTimeout <= 0 {
		s.StartTimeout = 2 * time.Minute
	}
	if s.StopGrace <= 0 {
		s.StopGrace = 20 * time.Second
	}
	if s.Out == nil {
		s.Out = io.Discard
	}
	if s.Log == nil {
		s.Log = slog.New(slog.DiscardHandler)
	}
	if s.Name == "" {
		s.Name = "process"
	}
	if s.Health == nil {
		s.Health = func(ctx context.Context) bool { return Healthz(ctx, s.HTTP, s.URL) }
	}
}

// PID returns the running process's pid (0 while none runs).
func (s *Process) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pid
}

// Restarts returns how many times the process was started again after an exit.
func (s *Process) Restarts() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.restarts
}

// Start starts the process and returns once it answers. If this first start fails (it exits,
// or does not answer within StartTimeout), Start returns why and nothing keeps running: a
// process that cannot start at all is a configuration error to show at once. Afterwards, exits
// are restarted until Stop.
func (s *Process) Start(ctx context.Context) error {
	s.defaults()
	s.stopc, s.done = make(chan struct{}), make(chan struct{})
	p, err := s.spawn(ctx)
	if err != nil {
		close(s.done)
		return err
	}
	go s.loop(p)
	return nil
}

// Stop stops the loop and the process (SIGTERM, SIGKILL after StopGrace) and waits for both.
// Stop of a Process that was never started returns at once.
func (s *Process) Stop() {
	if s.done == nil {
		return
	}
	s.stopOnce.Do(func() { close(s.stopc) })
	<-s.done
}

// DefaultResetAfter is Process.ResetAfter's default: 10s of service resets the backoff. It was a
// minute: a terraformer killed a minute or so apart waited ever longer (6.7s by the seventh
// kill) although it had served in between (issue 23).
const DefaultResetAfter = 10 * time.Second

// proc is one running process.
type proc struct {
	pid    int
	sig    chan syscall.Signal // to the process, sent by the goroutine that waits for it
	exited chan struct{}       // closed once it has exited; err is set then
	err    error
}

func (p *proc) signal(sig syscall.Signal) {
	select {
	case p.sig <- sig:
	case <-p.exited:
	}
}

// spawn starts one process and waits until it answers.
func (s *Process) spawn(ctx context.Context) (*proc, error) {
	p := &proc{sig: make(chan syscall.Signal), exited: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		// Pdeathsig is sent when the thread that started the child exits: keep this goroutine
		// on its thread until the child is gone.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		cmd := exec.Command(s.Bin, s.Args...)
		cmd.Env, cmd.Dir = s.Env, s.Dir
		cmd.Stdout, cmd.Stderr = s.Out, s.Out
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		p.pid = cmd.Process.Pid
		started <- nil
		waited := make(chan error, 1)
		go func() { waited <- cmd.Wait() }()
		for {
			select {
			case sig := <-p.sig:
				cmd.Process.Signal(sig)
			case err := <-waited:
				p.err = err
				close(p.exited)
				return
			}
		}
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("start %s: %w", s.Name, err)
	}
	s.setPID(p.pid)
	hctx, cancel := context.WithTimeout(ctx, s.StartTimeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if s.healthy(hctx) {
			// Ours, not another process on that address: ours is still running a moment later.
			select {
			case <-p.exited:
				return nil, fmt.Errorf("%s (pid %d) exited at start (%s); see its output", s.Name, p.pid, ExitCause(p.err))
			case <-time.After(200 * time.Millisecond):
			}
			return p, nil
		}
		select {
		case <-p.exited:
			return nil, fmt.Errorf("%s (pid %d) exited at start (%s); see its output", s.Name, p.pid, ExitCause(p.err))
		case <-s.stopc:
			s.kill(p)
			return nil, fmt.Errorf("%s: stopped while starting", s.Name)
		case <-hctx.Done():
			s.kill(p)
			return nil, fmt.Errorf("%s (pid %d) did not answer on %s within %s", s.Name, p.pid, s.URL, s.StartTimeout)
		case <-tick.C:
		}
	}
}

func (s *Process) healthy(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return s.Health(ctx)
}

// Healthz reports whether url's /healthz answers 200, asked with hc (nil: net/http's default
// client) within 2 s.
func Healthz(ctx context.Context, hc *http.Client, url string) bool {
	if hc == nil {
		hc = http.DefaultClient
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/healthz", nil)
	if err != nil {
		return false
	}
	resp, err := hc.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// kill stops p: SIGTERM, SIGKILL after StopGrace.
func (s *Process) kill(p *proc) {
	p.signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(s.StopGrace):
		s.Log.Warn(s.Name+" did not stop in time; killing it", "pid", p.pid, "grace", s.StopGrace)
		p.signal(syscall.SIGKILL)
		<-p.exited
	}
}

// loop watches the running process and restarts it until Stop.
func (s *Process) loop(p *proc) {
	defer close(s.done)
	attempt := 0
	upSince := time.Now()
	for {
		select {
		case <-s.stopc:
			s.kill(p)
			s.setPID(0)
			return
		case <-p.exited:
		}
		s.setPID(0)
		cause := ExitCause(p.err)
		what := fmt.Sprintf("%s (pid %d) exited (%s)", s.Name, p.pid, cause)
		s.Log.Error(s.Name+" exited", "pid", p.pid, "cause", cause)
		if time.Since(upSince) >= s.ResetAfter {
			attempt = 0
		}
		// A restart loop: each failed start counts as an exit too.
		for {
			delay := s.backoff(attempt)
			attempt++
			s.Log.Warn("restarting "+s.Name, "in", delay, "attempt", attempt, "after", what)
			s.down(fmt.Errorf("%s; restarting it in %s", what, delay.Round(time.Millisecond)))
			select {
			case <-s.stopc:
				return
			case <-time.After(delay):
			}
			s.down(&StartingError{After: what})
			np, err := s.spawn(context.Background())
			if err != nil {
				select {
				case <-s.stopc:
					return
				default:
				}
				what = "restart failed: " + err.Error()
				s.Log.Error(s.Name+" restart failed", "attempt", attempt, "err", err)
				continue
			}
			p = np
			break
		}
		s.mu.Lock()
		s.restarts++
		s.mu.Unlock()
		upSince = time.Now()
		s.Log.Info(s.Name+" restarted", "pid", p.pid, "url", s.URL, "attempt", attempt)
		if s.OnUp != nil {
			s.OnUp()
		}
	}
}

// StartingError is the cause OnDown is told while a new process starts (after the backoff,
// until it answers or its start fails, within StartTimeout): a caller that waits for the
// process should not give up during a start that is under way. Its Starting method says so to
// callers that test for interface{ Starting() bool } (errors.As) without importing this package.
type StartingError struct {
	After string // what happened before: "terraformer (pid 7) exited (signal: killed)"
}

func (e *StartingError) Error() string { return e.After + "; starting a new one" }

// Starting reports true: a new process is starting.
func (e *StartingError) Starting() bool { return true }

func (s *Process) down(cause error) {
	if s.OnDown != nil {
		s.OnDown(cause)
	}
}

func (s *Process) setPID(pid int) {
	s.mu.Lock()
	s.pid = pid
	s.mu.Unlock()
}

// backoff returns the wait before restart attempt n (0-based): MinBackoff·2ⁿ, at most
// MaxBackoff, with up to 10% jitter.
func (s *Process) backoff(n int) time.Duration {
	d := s.MinBackoff
	for i := 0; i < n && d < s.MaxBackoff; i++ {
		d *= 2
	}
	d = min(d, s.MaxBackoff)
	return d + time.Duration(rand.Int64N(int64(d)/10+1))
}

// ExitCause says how a process ended: "signal: killed", "exit status 1", ...
func ExitCause(err error) string {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return "exit status 0"
	case errors.As(err, &ee):
		return ee.ProcessState.String()
	}
	return err.Error()
}
