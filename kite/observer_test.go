package kite_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
)

// recorder is an Observer that keeps what it was told.
type recorder struct {
	mu      sync.Mutex
	served  []string // method code
	rejects []string
}

func (r *recorder) Served(method string, code int64, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.served = append(r.served, method+" "+strconv.FormatInt(code, 10))
}

func (r *recorder) HandshakeRejected(reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rejects = append(r.rejects, reason)
}

func (r *recorder) count(list *[]string, s string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, x := range *list {
		if x == s {
			n++
		}
	}
	return n
}

// TestObserver: the kite tells its Observer of each served call with the method's name (or
// UnknownMethod) and the code answered, and of each rejected handshake with its reason.
func TestObserver(t *testing.T) {
	rec := &recorder{}
	var refuse atomic.Bool
	e := newServer(t, func(o *kite.Options) {
		o.Observer = rec
		o.HandshakeTimeout = 200 * time.Millisecond
		o.OnHandshake = func(ctx context.Context, c *kite.Conn) error {
			if refuse.Load() {
				return errors.New("refused by the hook")
			}
			return nil
		}
	})
	e.server.HandleFunc("echo", func(_ context.Context, r *kite.Request) (any, error) { return "hi", nil })
	e.server.HandleFunc("fail", func(context.Context, *kite.Request) (any, error) {
		return nil, kite.ErrNotFound
	})
	_, c := e.dial("alice")
	if err := c.Call(t.Context(), "echo", nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Call(t.Context(), "fail", nil, nil); !errors.Is(err, kite.ErrNotFound) {
		t.Fatal(err)
	}
	if err := c.Call(t.Context(), "nope-user-text", nil, nil); !errors.Is(err, kite.ErrMethodNotFound) {
		t.Fatal(err)
	}
	if err := c.Call(t.Context(), "kite.handshake", kite.HandshakeParams{Kite: kite.Identity{Name: "x"}, Auth: kite.Auth{Type: kite.AuthKiteKey, Key: "user:alice"}}, nil); !errors.Is(err, kite.ErrState) {
		t.Fatal(err)
	}
	for _, want := range []string{"echo 0", "fail -32003", kite.UnknownMethod + " -32601", "kite.handshake 0", "kite.handshake -32005"} {
		if rec.count(&rec.served, want) != 1 {
			t.Errorf("served %q: %d times in %q", want, rec.count(&rec.served, want), rec.served)
		}
	}
	if rec.count(&rec.served, "nope-user-text -32601") != 0 {
		t.Error("an unknown method's name was reported")
	}

	ck := newClientKite(t, "bob")
	if _, err := ck.Dial(t.Context(), e.url, kite.Auth{Type: kite.AuthKiteKey, Key: "bogus"}); err == nil {
		t.Fatal("bogus key accepted")
	}
	if _, err := ck.Dial(t.Context(), e.url, kite.Auth{Type: kite.AuthKiteKey}); err == nil {
		t.Fatal("empty key accepted")
	}
	refuse.Store(true)
	if _, err := ck.Dial(t.Context(), e.url, kite.Auth{Type: kite.AuthKiteKey, Key: "user:bob"}); err == nil {
		t.Fatal("the hook's refusal was ignored")
	}
	ws := e.rawDial()
	go ws.Read(context.Background())
	testutil.Eventually(t, 10*time.Second, func() bool { return rec.count(&rec.rejects, kite.RejectTimeout) == 1 }, "no timeout rejection: %q", rec.rejects)
	for _, want := range []string{kite.RejectCredential, kite.RejectInvalid, kite.RejectRefused, kite.RejectRepeated, kite.RejectTimeout} {
		if n := rec.count(&rec.rejects, want); n != 1 {
			t.Errorf("rejections %q: %d in %q", want, n, rec.rejects)
		}
	}
}
