// Package tfclient is the client kloud (and `kloud tf`) calls terraformer with: one kite
// connection kept up with reconnects, a method per terraformer.* call, and Wait, which follows a
// job across terraformer restarts. Its params and results are terraformer/tfapi's; it links no
// engine. Start reading at [NewClient] and [Client.Wait].
package tfclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	tfjson "github.com/hashicorp/terraform-json"

	"github.com/kloud-dev/kloud/internal/tlsconf"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/terraformer/tfapi"
)

// Client is kloud's side of terraformer: one kite connection, kept up with reconnects, and a
// method per terraformer.* call. Errors from terraformer keep their kite codes:
// errors.Is(err, kite.ErrConflict) for a content id another job holds, kite.ErrNotFound for an
// unknown job, and so on. Safe for concurrent use.
//
// While terraformer is down, calls fail at once with an error wrapping [ErrUnavailable]
// ("terraformer unavailable: <cause>") instead of waiting for their timeout: when whoever
// supervises the process said so with [Client.SetUnavailable], or when no connection comes up
// within ConnectWait. The client reconnects on its own when terraformer is back (retrying at
// least once a second), and Wait follows a job across reconnects.
type Client struct {
	kc  *kite.Client
	url string
	// ConnectWait is how long a call waits for a connection before it fails with
	// ErrUnavailable (default 5s). Set it before the first call.
	ConnectWait time.Duration
	// WaitDown is how long Wait waits for terraformer to come back (a restart) before it
	// gives up with ErrUnavailable (default 2 min): a build must not wait forever for a
	// terraformer that does not return.
	WaitDown time.Duration

	mu   sync.Mutex
	down error        // set by SetUnavailable: why terraformer is down
	hc   *http.Client // Health's
}

// ErrUnavailable is wrapped by the errors of calls made while terraformer is down or
// unreachable; it is kite.ErrUnavailable, so it reaches kloud's callers as its own code.
var ErrUnavailable = kite.ErrUnavailable

// UnavailableError says why terraformer cannot be called now. errors.Is(err, ErrUnavailable)
// holds for it.
type UnavailableError struct{ Cause error }

func (e *UnavailableError) Error() string { return "terraformer unavailable: " + e.Cause.Error() }

// Unwrap returns ErrUnavailable first (so the wire code is "unavailable"), then the cause.
func (e *UnavailableError) Unwrap() []error { return []error{ErrUnavailable, e.Cause} }

// callTimeout bounds one call (not Wait) whose ctx has no deadline.
const callTimeout = 30 * time.Second

// Defaults of ConnectWait and WaitDown.
const (
	defaultConnectWait = 5 * time.Second
	defaultWaitDown    = 2 * time.Minute
)

// NewClient connects k to the terraformer at url (http://host:7001 or its /kite endpoint) in the
// background; auth returns the credential for each (re)connection (kloud's kite key, or a fresh
// token for terraformer's kite id). Calls wait for the connection. Close stops it.
func NewClient(k *kite.Kite, rawURL string, auth func(ctx context.Context) (kite.Auth, error)) *Client {
	u := KiteURL(rawURL)
	// Reconnect attempts at least once a second: a restarted terraformer is used within a
	// second of answering, and a refused dial costs nothing.
	kc := k.NewClient(kite.ClientOptions{URL: u, Auth: auth, MaxBackoff: time.Second})
	kc.Start()
	return &Client{kc: kc, url: u, hc: tlsconf.HTTPClient(k.Options().TLSConfig, 5*time.Second)}
}

// Health asks terraformer's /healthz (its version and terraform's) and /readyz, over HTTP(S)
// with the kite's TLS configuration. An error: it did not answer.
func (c *Client) Health(ctx context.Context) (tfapi.Health, error) {
	base := strings.TrimSuffix(c.url, "/kite")
	base = strings.Replace(strings.Replace(base, "ws://", "http://", 1), "wss://", "https://", 1)
	h := tfapi.Health{URL: base}
	get := func(path string, v any) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
		if err != nil {
			return err
		}
		resp, err := c.hc.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(v); err != nil {
			return fmt.Errorf("%s: %s: %w", base+path, resp.Status, err)
		}
		return nil
	}
	if err := get("/healthz", &h); err != nil {
		return h, err
	}
	return h, get("/readyz", &h.Readiness)
}

// KiteURL returns the kite endpoint for a terraformer URL: a URL without a path gets /kite.
func KiteURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || (u.Path != "" && u.Path != "/") {
		return raw
	}
	u.Path = "/kite"
	return u.String()
}

// URL returns the kite URL the client connects to.
func (c *Client) URL() string { return c.url }

// Connects returns how many times the client has connected (1 + reconnects).
func (c *Client) Connects() int { return c.kc.Connects() }

// Close stops reconnecting and closes the connection. Jobs keep running.
func (c *Client) Close() error { return c.kc.Close() }

// SetUnavailable marks terraformer as down: until SetAvailable, calls fail at once with an
// *UnavailableError carrying cause (e.g. "exited (signal: killed); restarting in 400ms"). A
// supervisor that restarts terraformer calls it when the process exits.
func (c *Client) SetUnavailable(cause error) {
	if cause == nil {
		cause = errors.New("down")
	}
	c.mu.Lock()
	c.down = cause
	c.mu.Unlock()
}

// SetAvailable undoes SetUnavailable: terraformer answers again (the connection comes back
// on its own).
func (c *Client) SetAvailable() {
	c.mu.Lock()
	c.down = nil
	c.mu.Unlock()
}

// Unavailable returns why terraformer is down (as SetUnavailable said), or nil.
func (c *Client) Unavailable() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.down == nil {
		return nil
	}
	return &UnavailableError{Cause: c.down}
}

// conn returns the connection for a call: an *UnavailableError if terraformer is marked down
// or no connection comes up within ConnectWait (while ctx is still live).
func (c *Client) conn(ctx context.Context) (*kite.Conn, error) {
	if err := c.Unavailable(); err != nil {
		return nil, err
	}
	wait := c.ConnectWait
	if wait <= 0 {
		wait = defaultConnectWait
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	conn, err := c.kc.Conn(wctx)
	if err == nil {
		return conn, nil
	}
	if ctx.Err() != nil || errors.Is(err, kite.ErrClosed) {
		return nil, err
	}
	if down := c.Unavailable(); down != nil {
		return nil, down // marked down while we waited: that cause says more
	}
	// The text only: the wait's deadline is not the caller's.
	return nil, &UnavailableError{Cause: errors.New(err.Error())}
}

// waitConn waits up to WaitDown for a connection (through a restart of terraformer).
func (c *Client) waitConn(ctx context.Context) (*kite.Conn, error) {
	d := c.WaitDown
	if d <= 0 {
		d = defaultWaitDown
	}
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	conn, err := c.kc.Conn(wctx)
	if err == nil || ctx.Err() != nil || errors.Is(err, kite.ErrClosed) {
		return conn, err
	}
	if down := c.Unavailable(); down != nil {
		return nil, fmt.Errorf("%w (no connection for %s)", down, d)
	}
	return nil, &UnavailableError{Cause: fmt.Errorf("no connection for %s: %s", d, err)}
}

// readOnly reports whether a method changes nothing on terraformer, so is safe to repeat.
func readOnly(method string) bool {
	return method == tfapi.MethodJob || method == tfapi.MethodState || method == tfapi.MethodOutputs
}

func (c *Client) call(ctx context.Context, method string, params, result any) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, callTimeout)
		defer cancel()
	}
	conn, err := c.conn(ctx)
	for err == nil {
		err = conn.Call(ctx, method, params, result)
		// A request that never left (the connection had just closed), or a read that lost its
		// answer, is sent again on the next connection: neither can have done work twice.
		retry := errors.Is(err, kite.ErrNotSent) || (errors.Is(err, kite.ErrClosed) && readOnly(method))
		if !retry || ctx.Err() != nil {
			break
		}
		select {
		case <-conn.Done():
		case <-ctx.Done():
		}
		if conn, err = c.conn(ctx); err != nil {
			break
		}
	}
	if err != nil && errors.Is(err, kite.ErrClosed) {
		// The connection broke during the call: if terraformer died meanwhile, say so.
		if down := c.Unavailable(); down != nil {
			err = fmt.Errorf("%w (the connection broke during the call)", down)
		}
	}
	if err != nil {
		if strings.HasPrefix(err.Error(), method) {
			return err
		}
		return fmt.Errorf("%s: %w", method, err)
	}
	return nil
}

// Plan starts `terraform plan` of the request and returns the job id at once.
func (c *Client) Plan(ctx context.Context, req tfapi.Request) (string, error) {
	return c.submit(ctx, tfapi.MethodPlan, req)
}

// Apply starts `terraform apply` of the request and returns the job id at once. A content id
// that another job holds is an error wrapping kite.ErrConflict.
func (c *Client) Apply(ctx context.Context, req tfapi.Request) (string, error) {
	return c.submit(ctx, tfapi.MethodApply, req)
}

// Destroy starts `terraform destroy` and returns the job id at once; without Files it destroys
// what the stored files of the content id describe.
func (c *Client) Destroy(ctx context.Context, req tfapi.Request) (string, error) {
	return c.submit(ctx, tfapi.MethodDestroy, req)
}

// submit starts a run. The call itself is not cut short by ctx (it has callTimeout): a caller
// whose ctx ended while terraformer was accepting the run would leave it running with nobody
// to cancel it. If ctx has ended by the time the run's id is known, the run is cancelled and
// the error is ctx's.
func (c *Client) submit(ctx context.Context, method string, req tfapi.Request) (string, error) {
	if err := req.Validate(); err != nil {
		return "", fmt.Errorf("%s: %s: %w", method, err.Error(), kite.ErrInvalidParams)
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), callTimeout)
	defer cancel()
	var res tfapi.SubmitResult
	if err := c.call(sctx, method, req, &res); err != nil {
		return "", err
	}
	if ctx.Err() != nil {
		if _, err := c.Cancel(context.WithoutCancel(ctx), res.JobID); err != nil && !errors.Is(err, kite.ErrState) {
			return "", fmt.Errorf("%s: %w (and cancelling its run %s: %w)", method, ctx.Err(), res.JobID, err)
		}
		return "", fmt.Errorf("%s: %w", method, ctx.Err())
	}
	return res.JobID, nil
}

// Job returns the job as terraformer has it now (running, or finished with its result).
func (c *Client) Job(ctx context.Context, jobID string) (*tfapi.Job, error) {
	var j tfapi.Job
	if err := c.call(ctx, tfapi.MethodJob, tfapi.JobParams{JobID: jobID}, &j); err != nil {
		return nil, err
	}
	return &j, nil
}

// Cancel stops the job (SIGINT to terraform, which saves the state; SIGKILL after the grace
// period) and returns it once it has stopped. Cancelling a finished job wraps kite.ErrState.
func (c *Client) Cancel(ctx context.Context, jobID string) (*tfapi.Job, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
	}
	var j tfapi.Job
	if err := c.call(ctx, tfapi.MethodCancel, tfapi.JobParams{JobID: jobID}, &j); err != nil {
		return nil, err
	}
	return &j, nil
}

// State returns the content id's state (`terraform show -json`) as of its last run.
func (c *Client) State(ctx context.Context, contentID string) (*tfjson.State, error) {
	var res tfapi.StateResult
	if err := c.call(ctx, tfapi.MethodState, tfapi.ContentParams{ContentID: contentID}, &res); err != nil {
		return nil, err
	}
	return res.State, nil
}

// Outputs returns the content id's root module outputs, name → value.
func (c *Client) Outputs(ctx context.Context, contentID string) (map[string]any, error) {
	var res tfapi.OutputsResult
	if err := c.call(ctx, tfapi.MethodOutputs, tfapi.ContentParams{ContentID: contentID}, &res); err != nil {
		return nil, err
	}
	return res.Outputs, nil
}

// Wait follows the job until it finishes and returns it. fn, if not nil, gets every event
// (on Wait's goroutine; a snapshot of the whole job first, and again after a reconnect).
//
// A lost connection does not lose the result: after reconnecting, Wait reads the job with
// terraformer.job (it may have finished meanwhile) and, if it still runs, watches it again. The
// returned error is nil only if the job succeeded; for a failed, cancelled or hung job it wraps
// the job's *tfapi.JobError (errors.As gives Terraform's diagnostics) and the job is returned
// too. If ctx ends first, Wait returns ctx's error; the job goes on.
func (c *Client) Wait(ctx context.Context, jobID string, fn func(tfapi.Event)) (*tfapi.Job, error) {
	if fn == nil {
		fn = func(tfapi.Event) {}
	}
	lost := false
	for attempt := 0; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("wait for job %s: %w", jobID, err)
		}
		if attempt > 0 {
			// Something went wrong with the last stream: do not spin.
			t := time.NewTimer(min(time.Duration(attempt)*100*time.Millisecond, 2*time.Second))
			select {
			case <-ctx.Done():
				t.Stop()
				return nil, fmt.Errorf("wait for job %s: %w", jobID, ctx.Err())
			case <-t.C:
			}
		}
		conn, err := c.waitConn(ctx)
		if err != nil {
			return nil, fmt.Errorf("wait for job %s: %w", jobID, err)
		}
		if lost {
			// The stream broke: the job may have finished while nobody watched.
			j, err := c.jobOn(ctx, conn, jobID)
			switch {
			case err == nil && j.Status.Final():
				fn(tfapi.Event{Type: tfapi.EventFinal, JobID: j.ID, Time: time.Now().UTC(), Status: j.Status, Percent: j.Percent, Job: j})
				return finished(j)
			case err != nil && !retryable(ctx, err):
				return nil, fmt.Errorf("wait for job %s: %w", jobID, err)
			case err != nil:
				continue
			}
		}
		j, err := c.watchOn(ctx, conn, jobID, fn)
		if j != nil {
			return finished(j)
		}
		if !retryable(ctx, err) {
			return nil, fmt.Errorf("wait for job %s: %w", jobID, err)
		}
		lost = true
	}
}

// finished returns the job and, unless it succeeded, its error.
func finished(j *tfapi.Job) (*tfapi.Job, error) {
	if j.Status == tfapi.StatusSucceeded {
		return j, nil
	}
	if j.Error != nil {
		return j, fmt.Errorf("job %s %s: %w", j.ID, j.Status, j.Error)
	}
	return j, fmt.Errorf("job %s %s", j.ID, j.Status)
}

// retryable reports whether Wait should try again after err: the connection dropped, the call
// timed out on a connection that went bad, or the stream broke, while ctx is still live.
func retryable(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	return errors.Is(err, kite.ErrClosed) || errors.Is(err, kite.ErrTimeout) || errors.Is(err, kite.ErrTooLarge) ||
		errors.Is(err, kite.ErrStreamEnded) || errors.Is(err, errNoFinal)
}

var errNoFinal = errors.New("stream ended without the final event")

func (c *Client) jobOn(ctx context.Context, conn *kite.Conn, jobID string) (*tfapi.Job, error) {
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	var j tfapi.Job
	if err := conn.Call(cctx, tfapi.MethodJob, tfapi.JobParams{JobID: jobID}, &j); err != nil {
		return nil, err
	}
	return &j, nil
}

// watchOn watches the job on conn until its final event (returned) or until the stream breaks
// (the error says why).
func (c *Client) watchOn(ctx context.Context, conn *kite.Conn, jobID string, fn func(tfapi.Event)) (*tfapi.Job, error) {
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	var res tfapi.WatchResult
	err := conn.Call(cctx, tfapi.MethodWatch, tfapi.JobParams{JobID: jobID}, &res)
	cancel()
	if err != nil {
		return nil, err
	}
	sub := conn.Subscribe(res.Subscription)
	defer sub.Close()
	for {
		n, err := sub.Next(ctx)
		if err != nil {
			if errors.Is(err, kite.ErrStreamEnded) {
				return nil, errNoFinal
			}
			var ke *kite.Error
			if errors.As(err, &ke) && ke.Code != kite.CodeTooLarge {
				// The stream ended with the job's error before we saw the final event (it
				// cannot, events come in order): read the job instead.
				return nil, fmt.Errorf("%w: %w", errNoFinal, err)
			}
			return nil, err
		}
		var ev tfapi.Event
		if err := json.Unmarshal(n.Data, &ev); err != nil {
			return nil, fmt.Errorf("decode %s: %w", tfapi.EventMethod, err)
		}
		fn(ev)
		if ev.Type == tfapi.EventFinal && ev.Job != nil {
			return ev.Job, nil
		}
	}
}
