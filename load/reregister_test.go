package load

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kontrol/kontrolapi"
)

// agentMaxBackoff is the simulated agents' reconnect ceiling: klient's (klient.Run: a
// kite.Client with MaxBackoff reconnectCeiling, 1s, and the client's default MinBackoff 100ms),
// or LOAD_AGENT_BACKOFF.
const agentMaxBackoff = time.Second

// TargetReregister is issue 23's: kloud restarted with 1,000 agents connected, all registered
// again in < 10 s (from the kill).
const TargetReregister = 10 * time.Second

// TestLoadReregister: LOAD_AGENTS simulated agents (full 1,000, tiny 50) registered with the
// kontrol inside a kloud process, each a real kite.Client that registers in OnConnect exactly
// as klient does (kite key auth, kontrol.register, klient's backoff); kloud is SIGKILLed and
// started again on the same data dir and port, and the time is taken until kontrol lists every
// agent again. The agents' keys are kite keys minted by kontrol.createKey (a machine's agent
// key needs a machine record; kontrol.register treats both alike).
func TestLoadReregister(t *testing.T) {
	t.Parallel()
	n := size(t, "LOAD_AGENTS", 1000, 50)
	backoff := duration(t, "LOAD_AGENT_BACKOFF", agentMaxBackoff, agentMaxBackoff)
	k := startKloud(t)
	ctx := context.Background()
	admin := k.admin(ctx)

	keys := make([]string, n)
	ids := make([]string, n)
	if err := fanOut(ctx, n, 8, func(ctx context.Context, i int) error {
		var r kontrolapi.CreateKeyResult
		if err := admin.Call(ctx, kontrolapi.MethodCreateKey, kontrolapi.CreateKeyParams{Username: "sim"}, &r); err != nil {
			return fmt.Errorf("kontrol.createKey: %w", err)
		}
		keys[i], ids[i] = r.Key, r.KiteID
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	// registered[i] is the time agent i's last kontrol.register answered (unix ns).
	registered := make([]atomic.Int64, n)
	clients := make([]*kite.Client, n)
	kites := make([]*kite.Kite, n)
	t.Cleanup(func() {
		var wg sync.WaitGroup
		for i := range n {
			if clients[i] != nil {
				wg.Go(func() { clients[i].Close(); kites[i].Close() })
			}
		}
		wg.Wait()
	})
	t0 := time.Now()
	for i := range n {
		kt, err := kite.New(kite.Options{Identity: kite.Identity{Name: "klient", ID: ids[i], Username: "sim"}})
		if err != nil {
			t.Fatal(err)
		}
		kites[i] = kt
		clients[i] = kt.NewClient(kite.ClientOptions{
			URL:  k.url() + "/kite",
			Auth: func(context.Context) (kite.Auth, error) { return kite.Auth{Type: kite.AuthKiteKey, Key: keys[i]}, nil },
			OnConnect: func(ctx context.Context, c *kite.Conn) error {
				var res kontrolapi.RegisterResult
				if err := c.Call(ctx, kontrolapi.MethodRegister, kontrolapi.RegisterParams{}, &res); err != nil {
					return fmt.Errorf("kontrol.register: %w", err)
				}
				registered[i].Store(time.Now().UnixNano())
				return nil
			},
			MaxBackoff: backoff,
		})
		clients[i].Start()
	}
	since := func(t0 time.Time) int {
		c := 0
		for i := range n {
			if registered[i].Load() >= t0.UnixNano() {
				c++
			}
		}
		return c
	}
	waitAll(t, 5*time.Minute, func() int { return since(t0) }, n, "first registration")
	first := time.Since(t0)
	listed := func(c *kite.Conn) int {
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		var res kontrolapi.QueryResult
		if err := c.Call(qctx, kontrolapi.MethodQuery, kontrolapi.QueryParams{Query: kite.Identity{Username: "sim", Name: "klient"}}, &res); err != nil {
			return -1
		}
		return len(res.Kites)
	}
	waitAll(t, time.Minute, func() int { return listed(admin) }, n, "kontrol.query lists the agents")

	// SIGKILL kloud, start it again on the same data and port.
	kill := time.Now()
	k.kill()
	k.start()
	up := time.Since(kill)
	waitAll(t, 2*time.Minute, func() int { return since(kill) }, n, "re-registration")
	var per []time.Duration
	last := time.Duration(0)
	for i := range n {
		d := time.Duration(registered[i].Load() - kill.UnixNano())
		per = append(per, d)
		last = max(last, d)
	}
	// kontrol's own view: every agent listed again, on a new admin connection.
	admin2 := k.admin(ctx)
	waitAll(t, time.Minute, func() int { return listed(admin2) }, n, "kontrol.query lists the agents after the restart")

	verdict := "met"
	if last >= TargetReregister {
		verdict = "MISSED"
	}
	report(fmt.Sprintf("| kloud SIGKILLed with %d agents connected (reconnect backoff 100ms doubling to %s, with jitter), restarted on the same data and port | first registration of all %s; kloud up again %s after the kill | all %d re-registered %s after the kill (per agent p50 %s, p99 %s) | < %s: %s | %s |",
		n, backoff, first.Round(time.Millisecond), up.Round(time.Millisecond), n, last.Round(time.Millisecond),
		pct(per, 50).Round(time.Millisecond), pct(per, 99).Round(time.Millisecond), TargetReregister, verdict, commit()))
	if full() && last >= TargetReregister {
		t.Errorf("re-registration of %d agents took %s, target < %s", n, last, TargetReregister)
	}
}

// waitAll polls count until it reaches n (or fails the test after timeout, saying how many).
func waitAll(t *testing.T, timeout time.Duration, count func() int, n int, what string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		c := count()
		if c >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d of %d after %s", what, c, n, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
