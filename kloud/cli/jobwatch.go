package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
)

// watchJob follows a kloud job through job.watch until it ends. On a terminal it draws a
// progress bar (percentage, stage, message) with the job's log lines scrolling above it;
// otherwise it prints a line per change. With --json it prints each event as one JSON line.
// It returns an error if the job did not succeed, or if following it failed (the job goes on).
func (g *globals) watchJob(ctx context.Context, c *kite.Conn, jobID string) (*api.JobEvent, error) {
	last, err := watchJobTo(ctx, c, jobID, g.stdout, g.json)
	if err != nil {
		return last, err
	}
	switch last.Status {
	case api.JobSucceeded:
		return last, nil
	case api.JobCancelled:
		return last, fmt.Errorf("job %s was cancelled", jobID)
	}
	return last, fmt.Errorf("job %s failed: %s", jobID, last.Error)
}

// watchJobTo follows job jobID to its end, drawing its progress on out (or, with jsonEvents,
// printing each event as a JSON line), and returns its last event.
func watchJobTo(ctx context.Context, c *kite.Conn, jobID string, out io.Writer, jsonEvents bool) (*api.JobEvent, error) {
	w, err := api.NewClient(c).JobWatch(ctx, api.JobRef{JobID: jobID})
	if err != nil {
		return nil, fmt.Errorf("follow job %s: %w", jobID, explain(err))
	}
	defer w.Close()
	p := &progress{w: out, tty: isTerminal(out)}
	var last *api.JobEvent
	for {
		je, err := w.Next(ctx)
		if err != nil {
			p.done()
			if errors.Is(err, kite.ErrStreamEnded) && last != nil && last.Status.Done() {
				break
			}
			return last, fmt.Errorf("stopped following job %s (it goes on in kloud): %w", jobID, err)
		}
		last = &je
		if jsonEvents {
			b, _ := json.Marshal(je)
			fmt.Fprintln(out, string(b))
		} else {
			p.update(&je)
		}
		if je.Status.Done() {
			p.done()
			break
		}
	}
	return last, nil
}

// planJob runs stack.plan as a job (stack.planJob) and returns its result: the job's progress
// and log go to stderr (not with --json); when ctx ends first (Ctrl-C), the job is cancelled,
// which stops terraform. A failed plan's error is the job's, as stack.plan would have said it.
func (g *globals) planJob(ctx context.Context, p api.StackPlanParams) (api.StackPlanResult, error) {
	var res api.StackPlanResult
	err := g.withConn(ctx, func(c *kite.Conn) error {
		var err error
		res, err = g.planJobOn(ctx, c, p)
		return err
	})
	return res, err
}

// planJobOn is planJob on connection c.
func (g *globals) planJobOn(ctx context.Context, c *kite.Conn, p api.StackPlanParams) (api.StackPlanResult, error) {
	var res api.StackPlanResult
	err := func() error {
		ref, err := api.NewClient(c).StackPlanJob(ctx, p)
		if err != nil {
			return explain(err)
		}
		out := g.stderr
		if g.json {
			out = io.Discard
		}
		last, err := watchJobTo(ctx, c, ref.JobID, out, false)
		if ctx.Err() != nil {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			if _, cerr := api.NewClient(c).JobCancel(cctx, ref); cerr != nil {
				return fmt.Errorf("interrupted; cancelling plan job %s: %w (cancel it with: kloud job cancel %s)", ref.JobID, cerr, ref.JobID)
			}
			return fmt.Errorf("plan cancelled (job %s): %w", ref.JobID, ctx.Err())
		}
		if err != nil {
			return err
		}
		switch last.Status {
		case api.JobSucceeded:
			res, err = api.PlanJobResult(last.Result)
			return err
		case api.JobCancelled:
			return fmt.Errorf("plan job %s was cancelled", ref.JobID)
		}
		return errors.New(last.Error)
	}()
	return res, err
}

// followJob ends a command that started job jobID: with detach it says how to follow the job
// (with --json, the job reference) and returns; else it follows the job to its end (watchJob).
// followed reports whether it did.
func (g *globals) followJob(ctx context.Context, c *kite.Conn, jobID string, detach bool) (followed bool, err error) {
	if detach {
		if g.json {
			return false, g.printJSON(api.JobRef{JobID: jobID})
		}
		fmt.Fprintf(g.stdout, "job %s started; follow it with: kloud job watch %s\n", jobID, jobID)
		return false, nil
	}
	_, err = g.watchJob(ctx, c, jobID)
	return true, err
}

// followStackJob is followJob for a job that builds stack stackID (apply, update, scale): after
// it succeeds, the stack's machines are listed (not with --json). kc is c's client.
func (g *globals) followStackJob(ctx context.Context, c *kite.Conn, kc *api.Client, stackID, jobID string, detach bool) error {
	followed, err := g.followJob(ctx, c, jobID, detach)
	if err != nil || !followed || g.json {
		return err
	}
	if st, err := kc.StackDescribe(ctx, api.StackRef{StackID: stackID}); err == nil {
		printMachines(g, st.MachineDocs)
	}
	return nil
}

// detachFlag adds --detach to a command that starts a job (see followJob).
func detachFlag(c *cobra.Command, detach *bool) {
	c.Flags().BoolVar(detach, "detach", false, "start the job and return without following it")
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// progress renders job events.
type progress struct {
	w       io.Writer
	tty     bool
	drawn   bool
	lastKey string
}

const barWidth = 30

func (p *progress) update(ev *api.JobEvent) {
	pct := min(max(ev.Percentage, 0), 100)
	if p.tty && p.drawn {
		fmt.Fprint(p.w, "\r\033[K") // the bar's line is reused
	}
	for _, l := range ev.Log {
		fmt.Fprintf(p.w, "  | %s\n", l)
	}
	status := strings.TrimSpace(ev.Stage + "  " + ev.Message)
	if p.tty {
		n := pct * barWidth / 100
		fmt.Fprintf(p.w, "[%s%s] %3d%%  %s", strings.Repeat("#", n), strings.Repeat(".", barWidth-n), pct, status)
		p.drawn = true
		return
	}
	if key := fmt.Sprint(pct, status); key != p.lastKey {
		p.lastKey = key
		fmt.Fprintf(p.w, "%3d%%  %s\n", pct, status)
	}
}

func (p *progress) done() {
	if p.tty && p.drawn {
		fmt.Fprintln(p.w)
		p.drawn = false
	}
}
