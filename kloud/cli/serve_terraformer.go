package cli

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

// tfSupervisor runs the terraformer that `kloud serve` starts (no --terraformer-url) and keeps
// it running: when it exits, it is started again after a backoff (100 ms, doubling up to 10 s;
// back to 100 ms after a minute of health), each exit and restart logged with its cause. While it
// is down, OnDown has told kloud's terraformer client why, so calls fail at once with
// "terraformer unavailable: <cause>"; OnUp clears that once the new process answers /healthz.
//
// The child gets SIGTERM from the kernel when kloud dies, even by SIGKILL (Pdeathsig; it is
// started on a locked OS thread that lives until the child has exited, since Pdeathsig follows
// the thread, not the process). terraformer then cancels its runs and exits; the terraform it
// runs dies with it (the sandbox launcher's pid namespace).
type tfSupervisor struct {
	Bin  string
	Args []string
	URL  string // http(s)://addr: where it answers /healthz
	// HTTP asks /healthz (nil: net/http's default client; with TLS, one trusting its CA).
	HTTP *http.Client
	Out  io.Writer
	Log  *slog.Logger
	// OnDown and OnUp, if set, are called when the process goes down (cause says why and when
	// it comes back) and when a (re)started process answers.
	OnDown func(cause error)
	OnUp   func()

	// Defaults: 100ms, 10s, 1 min, 30s, 20s.
	MinBackoff, MaxBackoff time.Duration
	ResetAfter             time.Duration // healthy this long: the next restart waits MinBackoff again
	StartTimeout           time.Duration // a start must answer /healthz within this
	StopGrace              time.Duration // SIGTERM, then SIGKILL after this

	mu       sync.Mutex
	pid      int
	restarts int
	stopc    chan struct{}
	done     chan struct{}
	stopOnce sync.Once
}

func (s *tfSupervisor) defaults() {
	if s.MinBackoff <= 0 {
		s.MinBackoff = 100 * time.Millisecond
	}
	if s.MaxBackoff <= 0 {
		s.MaxBackoff = 10 * time.Second
	}
	if s.ResetAfter <= 0 {
		s.ResetAfter = time.Minute
	}
	if s.StartTimeout <= 0 {
		s.StartTimeout = 30 * time.Second
	}
	if s.StopGrace <= 0 {
		s.StopGrace = 20 * time.Second
	}
	if s.Out == nil {
		s.Out = io.Discard
	}
	if s.Log == nil {
		s.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
}

// PID returns the running terraformer's pid (0 while none runs).
func (s *tfSupervisor) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pid
}

// Restarts returns how many times the process was started again after an exit.
func (s *tfSupervisor) Restarts() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.restarts
}

// Start starts terraformer and returns once it answers /healthz. If this first start fails
// (it exits, or does not answer within StartTimeout), Start returns why and nothing keeps
// running: a terraformer that cannot start at all is a configuration error to show at once.
// Afterwards, exits are restarted until Stop.
func (s *tfSupervisor) Start(ctx context.Context) error {
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

// Stop stops the loop and terraformer (SIGTERM, SIGKILL after StopGrace) and waits for both.
func (s *tfSupervisor) Stop() {
	s.stopOnce.Do(func() { close(s.stopc) })
	<-s.done
}

// proc is one running terraformer.
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

// spawn starts one process and waits until it answers /healthz.
func (s *tfSupervisor) spawn(ctx context.Context) (*proc, error) {
	p := &proc{sig: make(chan syscall.Signal), exited: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		// Pdeathsig is sent when the thread that started the child exits: keep this goroutine
		// on its thread until the child is gone.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		cmd := exec.Command(s.Bin, s.Args...)
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
		return nil, fmt.Errorf("start terraformer: %w", err)
	}
	s.mu.Lock()
	s.pid = p.pid
	s.mu.Unlock()
	hctx, cancel := context.WithTimeout(ctx, s.StartTimeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if healthyWith(hctx, s.HTTP, s.URL) {
			// Ours, not another process on that address: ours is still running a moment later.
			select {
			case <-p.exited:
				return nil, fmt.Errorf("terraformer (pid %d) exited at start (%s); see its output", p.pid, exitCause(p.err))
			case <-time.After(200 * time.Millisecond):
			}
			return p, nil
		}
		select {
		case <-p.exited:
			return nil, fmt.Errorf("terraformer (pid %d) exited at start (%s); see its output", p.pid, exitCause(p.err))
		case <-s.stopc:
			s.kill(p)
			return nil, errors.New("terraformer: stopped while starting")
		case <-hctx.Done():
			s.kill(p)
			return nil, fmt.Errorf("terraformer (pid %d) did not answer on %s within %s", p.pid, s.URL, s.StartTimeout)
		case <-tick.C:
		}
	}
}

func healthy(ctx context.Context, url string) bool { return healthyWith(ctx, nil, url) }

// healthyWith asks url's /healthz with hc (nil: net/http's default client).
func healthyWith(ctx context.Context, hc *http.Client, url string) bool {
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

// kill stops p: SIGTERM (terraformer cancels its runs and exits), SIGKILL after StopGrace.
func (s *tfSupervisor) kill(p *proc) {
	p.signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(s.StopGrace):
		s.Log.Warn("terraformer did not stop in time; killing it", "pid", p.pid, "grace", s.StopGrace)
		p.signal(syscall.SIGKILL)
		<-p.exited
	}
}

// loop watches the running process and restarts it until Stop.
func (s *tfSupervisor) loop(p *proc) {
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
		cause := exitCause(p.err)
		what := fmt.Sprintf("terraformer (pid %d) exited (%s)", p.pid, cause)
		s.Log.Error("terraformer exited", "pid", p.pid, "cause", cause)
		if time.Since(upSince) >= s.ResetAfter {
			attempt = 0
		}
		// A restart loop: each failed start counts as an exit too.
		for {
			delay := s.backoff(attempt)
			attempt++
			s.Log.Warn("restarting terraformer", "in", delay, "attempt", attempt, "after", what)
			s.down(fmt.Errorf("%s; restarting it in %s", what, delay.Round(time.Millisecond)))
			select {
			case <-s.stopc:
				return
			case <-time.After(delay):
			}
			s.down(fmt.Errorf("%s; starting a new one", what))
			np, err := s.spawn(context.Background())
			if err != nil {
				select {
				case <-s.stopc:
					return
				default:
				}
				what = "restart failed: " + err.Error()
				s.Log.Error("terraformer restart failed", "attempt", attempt, "err", err)
				continue
			}
			p = np
			break
		}
		s.mu.Lock()
		s.restarts++
		s.mu.Unlock()
		upSince = time.Now()
		s.Log.Info("terraformer restarted", "pid", p.pid, "url", s.URL, "attempt", attempt)
		if s.OnUp != nil {
			s.OnUp()
		}
	}
}

func (s *tfSupervisor) down(cause error) {
	if s.OnDown != nil {
		s.OnDown(cause)
	}
}

func (s *tfSupervisor) setPID(pid int) {
	s.mu.Lock()
	s.pid = pid
	s.mu.Unlock()
}

// backoff returns the wait before restart attempt n (0-based): MinBackoff·2ⁿ, at most
// MaxBackoff, with up to 10% jitter.
func (s *tfSupervisor) backoff(n int) time.Duration {
	d := s.MinBackoff
	for i := 0; i < n && d < s.MaxBackoff; i++ {
		d *= 2
	}
	d = min(d, s.MaxBackoff)
	return d + time.Duration(rand.Int64N(int64(d)/10+1))
}

// exitCause says how a process ended: "signal: killed", "exit status 1", ...
func exitCause(err error) string {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return "exit status 0"
	case errors.As(err, &ee):
		return ee.ProcessState.String()
	}
	return err.Error()
}
