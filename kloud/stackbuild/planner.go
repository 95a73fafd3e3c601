package stackbuild

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kloud-dev/kloud/klient/klientapi"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/userdata"
)

// Steps a machine goes through after Terraform created it; a failure names the step.
const (
	StepTerraform    = "terraform"
	StepBoot         = "boot"
	StepDownload     = "agent download"
	StepAgentStart   = "agent start"
	StepRegistration = "registration"
	StepPing         = "ping"
	StepUserScript   = "user script"
)

// Agents is how the planner finds agents; kloud implements it over kontrol.
type Agents interface {
	// WaitRegistered returns a caller of the agent with kite id once it has registered
	// (at once if it already has) with this kloud or another replica, or ctx's error.
	WaitRegistered(ctx context.Context, kiteID string) (Agent, error)
}

// Agent calls a machine's agent: its registration connection (a *kite.Conn), or a forwarder
// to the kloud replica that holds it.
type Agent interface {
	Call(ctx context.Context, method string, params, result any) error
}

// Expect is one machine the planner waits for.
type Expect struct {
	Label  string
	KiteID string
	// Machine, if it implements provider.ConsoleLogger, lets the planner say which provisioning step
	// failed: while it waits for the agent, it reads the console about once a second and fails
	// the machine as soon as a step failed (see ParseBootFailure), instead of at the timeout.
	Machine provider.Machine
	// Provider, if set, is the machine's provider: its console is read only if it has
	// provider.CapConsoleLog (a plugin's proxy machine has the method whether or not the plugin
	// does). Nil: the type assertion alone decides.
	Provider *provider.Provider
	// Fresh says the machine was just created (a build): everything in its console is from
	// this boot, so any failure already there counts. Otherwise the console may still hold an
	// earlier boot's provisioning (a start of an existing machine): a user script's failure
	// already there when the planner first looks is not this boot's (failures before the agent
	// started are: a machine whose agent never started is not started again, it is rebuilt).
	Fresh bool
}

// AgentResult is what became of one expected agent.
type AgentResult struct {
	Label   string
	KiteID  string
	OK      bool
	Step    string // the step that failed ("" if OK)
	Err     error
	LogTail string          // the relevant log's end: console (cloud-init) or the user script's
	Info    *klientapi.Info // the agent's klient.info, when it answered
}

// Planner waits for the agents of freshly built or started machines: registration with kontrol
// (pushed, not polled), an answer to kite.ping, and the end of provisioning (the user's script).
type Planner struct {
	Agents Agents
	// Timeout for each machine (default 5 min).
	Timeout time.Duration
	// PollInterval between klient.info calls while provisioning finishes (default 100ms: the
	// call is cheap, and a long interval is pure latency added to every build).
	PollInterval time.Duration
	// ConsolePoll is how often the console of a machine that implements
	// provider.ConsoleLogger is read while its agent has not registered (default 1s): a
	// provisioning step that failed inside the machine (see ParseBootFailure) fails the
	// machine at once instead of at Timeout.
	ConsolePoll time.Duration
	Log         *slog.Logger
	// Observe, if set, is told when the planner starts waiting for an agent (d 0, r nil) and
	// how each wait ended and how long it took (kloud's metrics).
	Observe func(r *AgentResult, d time.Duration)
}

// Wait waits for every expected agent concurrently and returns one result per Expect, in order.
// progress, if set, is called as each result is known.
func (p *Planner) Wait(ctx context.Context, expects []Expect, progress func(AgentResult)) []AgentResult {
	out := make([]AgentResult, len(expects))
	var wg sync.WaitGroup
	var mu sync.Mutex
	for i, e := range expects {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			if p.Observe != nil {
				p.Observe(nil, 0)
			}
			r := p.one(ctx, e)
			if p.Observe != nil {
				p.Observe(&r, time.Since(start))
			}
			out[i] = r
			if progress != nil {
				mu.Lock()
				progress(r)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return out
}

func (p *Planner) timeout() time.Duration {
	if p.Timeout <= 0 {
		return 5 * time.Minute
	}
	return p.Timeout
}

func (p *Planner) log() *slog.Logger {
	if p.Log == nil {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return p.Log
}

func (p *Planner) one(ctx context.Context, e Expect) AgentResult {
	r := AgentResult{Label: e.Label, KiteID: e.KiteID}
	ctx, cancel := context.WithTimeout(ctx, p.timeout())
	defer cancel()
	// While waiting for the agent, watch the machine's console for a failed provisioning step.
	regCtx, regCancel := context.WithCancel(ctx)
	watchCtx, stopWatch := context.WithCancel(ctx)
	watched := make(chan consoleFailure, 1)
	go func() {
		f := p.watchConsole(watchCtx, e)
		if f.err != nil {
			regCancel()
		}
		watched <- f
	}()
	conn, err := p.Agents.WaitRegistered(regCtx, e.KiteID)
	stopWatch()
	cf := <-watched
	regCancel()
	if err != nil && cf.err != nil {
		r.Step, r.LogTail = cf.step, cf.tail
		r.Err = fmt.Errorf("%s: %w%s", e.Label, cf.err, quoteTail(cf.tail))
		return r
	}
	if err != nil {
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			r.Step, r.Err = StepRegistration, fmt.Errorf("%s: waiting for the agent: %w", e.Label, err)
			return r
		}
		r.Step, r.LogTail = p.diagnose(e)
		r.Err = fmt.Errorf("%s: the agent did not register within %s (%s failed or never finished)%s", e.Label, p.timeout(), r.Step, quoteTail(r.LogTail))
		return r
	}
	var pong string
	if err := conn.Call(ctx, "kite.ping", nil, &pong); err != nil || pong != "pong" {
		r.Step, r.Err = StepPing, fmt.Errorf("%s: the agent registered but did not answer kite.ping: %v", e.Label, err)
		return r
	}
	tick := p.PollInterval
	if tick <= 0 {
		tick = 100 * time.Millisecond
	}
	for {
		var info klientapi.Info
		if err := conn.Call(ctx, klientapi.MethodInfo, nil, &info); err != nil {
			if ctx.Err() != nil {
				r.Step, r.Err = StepUserScript, fmt.Errorf("%s: provisioning did not finish within %s", e.Label, p.timeout())
				r.LogTail = tail(ctx, conn, "user-script")
				return r
			}
			// The agent may be restarting; wait for it to come back.
			if conn, err = p.Agents.WaitRegistered(ctx, e.KiteID); err != nil {
				r.Step, r.Err = StepPing, fmt.Errorf("%s: the agent went away: %w", e.Label, err)
				return r
			}
			continue
		}
		r.Info = &info
		switch st := provisionDone(info.Provision); st {
		case "ok":
			r.OK = true
			return r
		case "failed":
			r.Step = StepUserScript
			code := -1
			if us := info.Provision.UserScript; us != nil && us.ExitCode != nil {
				code = *us.ExitCode
			}
			r.LogTail = tail(context.Background(), conn, "user-script")
			r.Err = fmt.Errorf("%s: the user script failed (exit code %d)%s", e.Label, code, quoteTail(r.LogTail))
			if info.Provision.UserScript == nil {
				r.Step = StepAgentStart
				r.LogTail = tail(context.Background(), conn, "provision")
				r.Err = fmt.Errorf("%s: provisioning failed at %s%s", e.Label, info.Provision.Provision.Step, quoteTail(r.LogTail))
			}
			return r
		}
		select {
		case <-ctx.Done():
			r.Step, r.Err = StepUserScript, fmt.Errorf("%s: the user script did not finish within %s", e.Label, p.timeout())
			r.LogTail = tail(context.Background(), conn, "user-script")
			return r
		case <-time.After(tick):
		}
	}
}

// provisionDone says whether provisioning finished: "ok", "failed", or "" (still running).
// An agent that reports no provisioning state was installed some other way: it is done.
func provisionDone(ps *klientapi.ProvisionState) string {
	if ps == nil || ps.Provision == nil {
		if ps != nil && ps.UserScript != nil {
			switch ps.UserScript.State {
			case userdata.UserScriptDone:
				return "ok"
			case userdata.UserScriptFailed:
				return "failed"
			}
			return ""
		}
		return "ok"
	}
	if ps.Provision.Step == userdata.StepDone {
		if ps.Provision.Status == userdata.StatusOK {
			return "ok"
		}
		return "failed"
	}
	if ps.Provision.Status == userdata.StatusFailed {
		return "failed"
	}
	return ""
}

func tail(ctx context.Context, c Agent, name string) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var res klientapi.LogsResult
	if err := c.Call(ctx, klientapi.MethodLogs, klientapi.LogsParams{Name: name, Bytes: 2048}, &res); err != nil {
		return ""
	}
	return res.Tail
}

func quoteTail(t string) string {
	t = strings.TrimSpace(t)
	if t == "" {
		return ""
	}
	return ":\n" + t
}

// consoleLogger returns e's machine as a console logger, if it is one and its provider (when
// known) has the capability.
func (e Expect) consoleLogger() (provider.ConsoleLogger, bool) {
	if e.Provider != nil && !e.Provider.Can(provider.CapConsoleLog) {
		return nil, false
	}
	cl, ok := e.Machine.(provider.ConsoleLogger)
	return cl, ok
}

// consoleFailure is what watchConsole found: err is nil if nothing failed (yet).
type consoleFailure struct {
	step, tail string
	err        error
}

// watchConsole reads the console of e's machine every ConsolePoll until ctx ends or the console
// shows a failed provisioning step. Machines without provider.ConsoleLogger are not watched. A download
// that keeps failing counts only once an attempt failed while this planner watched: attempts
// that failed while kloud was down (a restart mid-build) say nothing about now.
func (p *Planner) watchConsole(ctx context.Context, e Expect) consoleFailure {
	cl, ok := e.consoleLogger()
	if !ok {
		return consoleFailure{}
	}
	every := p.ConsolePoll
	if every <= 0 {
		every = time.Second
	}
	first := true
	var old *BootFailure // what the first read showed, for a machine that is not fresh
	baseline := 0        // failed download attempts in the first read
	for {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		out, err := cl.ConsoleLog(rctx)
		cancel()
		if errors.Is(err, provider.ErrUnsupported) { // a plugin's proxy without the capability
			return consoleFailure{}
		}
		if err != nil {
			if ctx.Err() == nil {
				p.log().Debug("read console", "machine", e.Label, "err", err)
			}
		} else {
			f := ParseBootFailure(out)
			if first {
				first = false
				if f != nil && f.Retrying {
					baseline = f.Attempts
				}
				// Only a machine whose agent once started can be started again: what a
				// console shows of an earlier boot is a user script's failure, if anything.
				if !e.Fresh && f != nil && f.Step == StepUserScript {
					old = f
				}
			}
			if f != nil && (old == nil || *f != *old) && (!f.Retrying || f.Attempts > baseline) {
				p.log().Info("provisioning failed inside the machine", "machine", e.Label, "step", f.Step, "detail", f.Detail)
				return consoleFailure{step: f.Step, tail: provisionTail(out, 2048), err: f}
			}
		}
		select {
		case <-ctx.Done():
			return consoleFailure{}
		case <-time.After(every):
		}
	}
}

// BootFailure is a provisioning step that failed inside a machine, as its console log shows.
type BootFailure struct {
	// Step is the planner's name of the step: StepDownload, StepAgentStart, StepUserScript or
	// StepBoot.
	Step string
	// Marker is provision.sh's step that failed ("download", "verify", ...), or "" when
	// provision.sh did not say (cloud-init ended without it).
	Marker string
	// Detail says what failed.
	Detail string
	// Retrying is set for a klient download that failed its last attempts and that provision.sh
	// is still retrying; Attempts is the number of the last failed attempt.
	Retrying bool
	Attempts int
}

func (f *BootFailure) Error() string {
	if f.Marker == "" {
		return fmt.Sprintf("%s failed inside the machine: %s", f.Step, f.Detail)
	}
	return fmt.Sprintf("%s failed inside the machine (provision.sh step %s: %s)", f.Step, f.Marker, f.Detail)
}

// DownloadFailuresToFail is how many klient download attempts in a row must fail before
// ParseBootFailure calls the download failed while provision.sh still retries (it would for
// about 90 s). kloud serves the download itself, so while it runs, a refused or failed
// download means the machine cannot reach it.
const DownloadFailuresToFail = 2

var (
	attemptRe  = regexp.MustCompile(`kloud-provision: download attempt (\d+) failed \(curl exit code (\d+)\)`)
	curlErrRe  = regexp.MustCompile(`^curl: \(\d+\) .*`)
	cloudEndRe = regexp.MustCompile(`Cloud-init v\. \S+ finished at`)
)

// ParseBootFailure reads a machine's console log (cloud-init's output: provision.sh prints its
// marker lines there, see package userdata) and returns the provisioning step that failed, or
// nil while none has. A step failed when:
//   - provision.sh printed status=failed for it (the first such marker names it: a failed user
//     script also fails "done");
//   - the klient download failed on its last DownloadFailuresToFail attempts in a row (refused,
//     unreachable, an HTTP error): Retrying is set, provision.sh is still trying;
//   - cloud-init finished while provision.sh never started, or stopped in the middle of a step
//     without saying so (killed).
func ParseBootFailure(console string) *BootFailure {
	markers := userdata.ParseMarkers([]byte(console))
	for _, m := range markers {
		if m.Status == userdata.StatusFailed {
			return &BootFailure{Step: planStep(m.Step), Marker: m.Step, Detail: m.Detail}
		}
	}
	var last *userdata.Marker
	if len(markers) > 0 {
		last = &markers[len(markers)-1]
	}
	if last != nil && last.Step == userdata.StepDownload && last.Status == userdata.StatusStart {
		// Attempts after the last download start: provision.sh may have run before.
		seg := console
		if i := strings.LastIndex(console, "step=download status=start"); i >= 0 {
			seg = console[i:]
		}
		var n, code, inRow int
		var curlErr string
		for _, line := range strings.Split(seg, "\n") {
			line = strings.TrimRight(line, "\r")
			if m := curlErrRe.FindString(line); m != "" {
				curlErr = m
			}
			if m := attemptRe.FindStringSubmatch(line); m != nil {
				n, _ = strconv.Atoi(m[1])
				code, _ = strconv.Atoi(m[2])
				inRow++
			}
		}
		if inRow >= DownloadFailuresToFail {
			d := fmt.Sprintf("the klient download from %s failed %d times in a row, last with curl exit code %d", last.Detail, inRow, code)
			if curlErr != "" {
				d += " (" + curlErr + ")"
			}
			if code == 7 {
				d += "; is kloud listening on an address the machine can reach? (kloud serve warns at startup when it is not)"
			}
			return &BootFailure{Step: StepDownload, Marker: userdata.StepDownload, Detail: d, Retrying: true, Attempts: n}
		}
	}
	if cloudEndRe.MatchString(console) {
		switch {
		case last == nil:
			return &BootFailure{Step: StepBoot, Detail: "cloud-init finished without running kloud's provisioning (provision.sh printed nothing; see the console log)"}
		case last.Status == userdata.StatusStart:
			return &BootFailure{Step: planStep(last.Step), Marker: last.Step, Detail: "provision.sh stopped in the middle of this step (cloud-init finished)"}
		}
	}
	return nil
}

// planStep names a provision.sh step the way the planner's results do.
func planStep(marker string) string {
	switch marker {
	case userdata.StepDownload, userdata.StepVerify, userdata.StepInstall:
		return StepDownload
	case userdata.StepStartKlient:
		return StepAgentStart
	case userdata.StepUserScript, userdata.StepDone:
		return StepUserScript
	}
	return StepBoot
}

// diagnose reads the console of a machine whose agent never registered and names the step that
// failed.
func (p *Planner) diagnose(e Expect) (step, logTail string) {
	cl, ok := e.consoleLogger()
	if !ok {
		return StepRegistration, ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	out, err := cl.ConsoleLog(ctx)
	if errors.Is(err, provider.ErrUnsupported) { // a plugin's proxy without the capability
		return StepRegistration, ""
	}
	if err != nil {
		p.log().Warn("read console", "machine", e.Label, "err", err)
		return StepBoot, ""
	}
	logTail = lastBytes(out, 2048)
	markers := userdata.ParseMarkers([]byte(out))
	if len(markers) == 0 {
		return StepBoot, logTail
	}
	last := markers[len(markers)-1]
	switch last.Step {
	case userdata.StepDownload, userdata.StepVerify, userdata.StepInstall:
		return StepDownload, logTail
	case userdata.StepStartKlient:
		if last.Status == userdata.StatusOK {
			return StepRegistration, logTail
		}
		return StepAgentStart, logTail
	}
	return StepRegistration, logTail
}

// provisionTail returns the end of a console log, at most n bytes, from provision.sh's first
// line on when that is in reach (what came before is the boot's own chatter).
func provisionTail(s string, n int) string {
	t := lastBytes(s, n)
	if i := strings.LastIndex(t, "kloud-provision: started"); i >= 0 {
		return t[i:]
	}
	return t
}

func lastBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[len(s)-n:]
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return s
}
