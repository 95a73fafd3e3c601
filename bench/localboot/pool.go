package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/coder/websocket"

	"github.com/kloud-dev/kloud/klient/webterm"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
)

// Prebuilt stacks (-pool): how long from `stack create` to a terminal that answers, for a
// stack claimed from a pool of one against one built on demand, in the same run. Each round:
//
//   - built: stack.create, stack.apply, the job followed to its end, then a terminal opened
//     through kloud's terminal endpoint (as `kloud ssh` opens it) and `echo` answered in it;
//   - claimed: with the pool's stack ready, stack.create (it answers claimed), the stack.claim
//     job followed to its end (the machine's agent restarted with the owner's key and
//     registered), then the same terminal and echo.
//
// Target (issue 25): claim → terminal < 1 s.

// poolRun is one round's figures.
type poolRun struct {
	built, claimed         time.Duration // stack.create called → echo answered
	claimCall, claimJob    time.Duration // stack.create's answer; its job's end (from the call)
	builtTerm, claimedTerm time.Duration // terminal dial → echo answered
}

// poolRounds measures o.rounds rounds of a 1-machine template's pool.
func (h *harness) poolRounds(ctx context.Context) ([]poolRun, error) {
	// Two templates of the same files: one with the pool, one without (its stacks are built).
	tid, err := h.createTemplate(ctx, 1)
	if err != nil {
		return nil, err
	}
	built, err := h.createTemplate(ctx, 1)
	if err != nil {
		return nil, err
	}
	kc := api.NewClient(h.conn)
	if _, err := kc.PoolSet(ctx, api.PoolSetParams{TemplateID: tid, Size: 1}); err != nil {
		return nil, fmt.Errorf("pool.set: %w", err)
	}
	var out []poolRun
	defer func() {
		// The pool goes; kloud destroys its idle stack. Wait for that, so the cleanup's gc finds
		// nothing of kloud's in use.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Minute)
		defer cancel()
		if _, err := kc.PoolDelete(dctx, api.PoolRef{ID: tid}); err != nil {
			h.stepf("pool.delete: %s", err)
			return
		}
		for dctx.Err() == nil {
			if n, err := h.poolStacks(dctx, tid); err == nil && n == 0 {
				return
			}
			time.Sleep(500 * time.Millisecond)
		}
	}()
	for i := range h.o.rounds {
		var r poolRun
		h.stepf("pool round %d: a stack built on demand", i+1)
		t0 := time.Now()
		created, err := kc.StackCreate(ctx, api.StackPlanParams{TemplateID: built})
		if err != nil {
			return out, fmt.Errorf("stack.create: %w", err)
		}
		if created.Claimed {
			return out, errors.New("stack.create claimed a stack of a template without a pool")
		}
		h.stacks = append(h.stacks, created.Stack.ID)
		applied, err := kc.StackApply(ctx, api.StackApplyParams{StackID: created.Stack.ID})
		if err != nil {
			return out, fmt.Errorf("stack.apply: %w", err)
		}
		if _, err := h.watchJob(ctx, applied.JobID); err != nil {
			return out, err
		}
		if r.builtTerm, err = h.terminalEcho(ctx, created.Stack.ID); err != nil {
			return out, err
		}
		r.built = time.Since(t0)
		if err := h.destroyStack(ctx, created.Stack.ID); err != nil {
			return out, err
		}

		// From the pool (it builds its next stack after each claim).
		h.stepf("pool round %d: waiting for the pool's stack", i+1)
		if err := h.poolReady(ctx, tid); err != nil {
			return out, err
		}
		h.stepf("pool round %d: claim", i+1)
		t0 = time.Now()
		claimed, err := kc.StackCreate(ctx, api.StackPlanParams{TemplateID: tid})
		if err != nil {
			return out, fmt.Errorf("stack.create: %w", err)
		}
		r.claimCall = time.Since(t0)
		if !claimed.Claimed {
			h.stacks = append(h.stacks, claimed.Stack.ID)
			return out, errors.New("stack.create did not claim the pool's ready stack")
		}
		h.stacks = append(h.stacks, claimed.Stack.ID)
		end, err := h.watchJob(ctx, claimed.JobID)
		if err != nil {
			return out, err
		}
		r.claimJob = end.Sub(t0)
		if r.claimedTerm, err = h.terminalEcho(ctx, claimed.Stack.ID); err != nil {
			return out, err
		}
		r.claimed = time.Since(t0)
		h.stepf("pool round %d: built %s, claimed %s (call %s, job %s, terminal %s)", i+1, secs(r.built), secs(r.claimed), secs(r.claimCall), secs(r.claimJob), secs(r.claimedTerm))
		if err := h.destroyStack(ctx, claimed.Stack.ID); err != nil {
			return out, err
		}
		out = append(out, r)
	}
	return out, nil
}

// poolStacks counts the stacks of pool id no user claimed.
func (h *harness) poolStacks(ctx context.Context, id string) (int, error) {
	res, err := api.NewClient(h.conn).StackList(ctx, api.StackListParams{All: true})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, st := range res.Stacks {
		if st.Pool == id && st.Owner == model.PoolOwner {
			n++
		}
	}
	return n, nil
}

// poolReady waits until pool id has a ready stack.
func (h *harness) poolReady(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	for {
		res, err := api.NewClient(h.conn).PoolList(ctx, api.PoolListParams{})
		if err != nil {
			return fmt.Errorf("pool.list: %w", err)
		}
		for _, p := range res.Pools {
			if p.ID == id && p.Ready > 0 {
				return nil
			}
			if p.ID == id && p.Failed > 0 {
				return fmt.Errorf("the pool's build failed: %+v", p)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the pool's stack: %w", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// terminalEcho opens a terminal on stack stackID's machine through kloud's terminal endpoint
// (what `kloud ssh` and the browser open) and waits for an echo; it returns how long that took.
func (h *harness) terminalEcho(ctx context.Context, stackID string) (time.Duration, error) {
	st, err := api.NewClient(h.conn).StackDescribe(ctx, api.StackRef{StackID: stackID})
	if err != nil || len(st.MachineDocs) != 1 {
		return 0, fmt.Errorf("stack.describe %s: %d machines, %v", stackID, len(st.MachineDocs), err)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	t0 := time.Now()
	ws, _, err := websocket.Dial(ctx, h.kloudURL+"/api/machines/"+st.MachineDocs[0].ID+"/terminal?cols=120&rows=40",
		&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + h.adminKey}}})
	if err != nil {
		return 0, fmt.Errorf("open a terminal: %w", err)
	}
	defer ws.Close(websocket.StatusNormalClosure, "")
	ws.SetReadLimit(webterm.MaxFrame)
	if err := ws.Write(ctx, websocket.MessageBinary, append([]byte{webterm.OpInput}, "echo pool-$((40+2))\r"...)); err != nil {
		return 0, err
	}
	var seen strings.Builder
	for {
		typ, b, err := ws.Read(ctx)
		if err != nil {
			return 0, fmt.Errorf("terminal: %w (output so far: %q)", err, seen.String())
		}
		if typ == websocket.MessageBinary {
			seen.Write(b)
			if strings.Contains(seen.String(), "pool-42") {
				return time.Since(t0), nil
			}
		}
	}
}
