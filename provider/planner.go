package provider

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/klient"
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
	// WaitRegistered returns a connection to the agent with kite id once it has registered
	// (at once if it already has), or ctx's error.
	WaitRegistered(ctx context.Context, kiteID string) (*kite.Conn, error)
}

// Expect is one machine the planner waits for.
type Expect struct {
	Label  string
	KiteID string
	// Machine, if it implements ConsoleLogger, lets the planner say which provisioning step
	// failed when the agent never registers.
	Machine Machine
}

// AgentResult is what became of one expected agent.
type AgentResult struct {
	Label   string
	KiteID  string
	OK      bool
	Step    string // the step that failed ("" if OK)
	Err     error
	LogTail string       // the relevant log's end: console (cloud-init) or the user script's
	Info    *klient.Info // the agent's klient.info, when it answered
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
	Log          *slog.Logger
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
			r := p.one(ctx, e)
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
	conn, err := p.Agents.WaitRegistered(ctx, e.KiteID)
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
		var info klient.Info
		if err := conn.Call(ctx, "klient.info", nil, &info); err != nil {
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
func provisionDone(ps *klient.ProvisionState) string {
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

func tail(ctx context.Context, c *kite.Conn, name string) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var res klient.LogsResult
	if err := c.Call(ctx, "klient.logs", klient.LogsParams{Name: name, Bytes: 2048}, &res); err != nil {
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

// diagnose reads the console of a machine whose agent never registered and names the step that
// failed.
func (p *Planner) diagnose(e Expect) (step, logTail string) {
	cl, ok := e.Machine.(ConsoleLogger)
	if !ok {
		return StepRegistration, ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	out, err := cl.ConsoleLog(ctx)
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
