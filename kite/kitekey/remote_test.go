package kitekey_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
)

// remote is a kite that is not kontrol: RemoteKeys fetching from kontrol's real keyring, with a
// switch to make kontrol unreachable.
type remote struct {
	keys    *kitekey.RemoteKeys
	fetches atomic.Int32
	down    atomic.Bool
}

func newRemote(e *env) *remote {
	r := &remote{}
	r.keys = &kitekey.RemoteKeys{
		Now: e.clock.Now,
		Fetch: func(ctx context.Context) ([]kitekey.PublicKey, error) {
			r.fetches.Add(1)
			if r.down.Load() {
				return nil, errors.New("dial kontrol: connection refused")
			}
			return e.ring.Public(), nil
		},
	}
	return r
}

func TestRemoteKeysRotation(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	r := newRemote(e)
	v := &kitekey.Verifier{Keys: r.keys, Issuer: issuer, Now: e.clock.Now}

	tok1, err := e.signer.Token("alice", "kite-A", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Token(ctx, tok1, "kite-A"); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Token(ctx, tok1, "kite-A"); err != nil {
		t.Fatal(err)
	}
	if n := r.fetches.Load(); n != 1 {
		t.Fatalf("%d fetches for one key used twice, want 1", n)
	}

	// kontrol rotates. Right after the last fetch the new kid is not refetched...
	e.clock.Add(time.Second)
	if _, err := e.ring.Rotate(ctx); err != nil {
		t.Fatal(err)
	}
	tok2, err := e.signer.Token("alice", "kite-A", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	_, err = v.Token(ctx, tok2, "kite-A")
	mustReject(t, err, kitekey.ErrUnknownKey)
	// ...nor does a flood of made-up kids cause fetches.
	for i := range 100 {
		if _, err := r.keys.PublicKey(ctx, fmt.Sprintf("made-up-%d", i)); !errors.Is(err, kitekey.ErrUnknownKey) {
			t.Fatalf("made-up kid: %v", err)
		}
	}
	if n := r.fetches.Load(); n != 1 {
		t.Fatalf("%d fetches within MinRefresh, want 1", n)
	}

	// Once MinRefresh has passed, the unknown kid triggers one refetch and verifies.
	e.clock.Add(9 * time.Second)
	if _, err := v.Token(ctx, tok2, "kite-A"); err != nil {
		t.Fatalf("new key after MinRefresh: %v", err)
	}
	if _, err := v.Token(ctx, tok1, "kite-A"); err != nil {
		t.Fatalf("old key after rotation: %v", err)
	}
	if n := r.fetches.Load(); n != 2 {
		t.Fatalf("%d fetches, want 2", n)
	}

	// kontrol retires the old key; once the cache is older than MaxAge the old key stops verifying.
	if err := e.ring.Retire(ctx, kidOf(t, tok1)); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Token(ctx, tok1, "kite-A"); err != nil {
		t.Fatalf("retired key within MaxAge of the last fetch still verifies from cache: %v", err)
	}
	e.clock.Add(5 * time.Minute)
	_, err = v.Token(ctx, tok1, "kite-A")
	mustReject(t, err, kitekey.ErrUnknownKey)
	if _, err := v.Token(ctx, tok2, "kite-A"); err != nil {
		t.Fatalf("current key: %v", err)
	}
	if n := r.fetches.Load(); n != 3 {
		t.Fatalf("%d fetches, want 3", n)
	}
}

func TestRemoteKeysKontrolDown(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	r := newRemote(e)
	kid := e.ring.Current().ID

	// Never fetched and kontrol down: the error is about reaching kontrol, not authentication.
	r.down.Store(true)
	_, err := r.keys.PublicKey(ctx, kid)
	if err == nil || errors.Is(err, kite.ErrAuth) {
		t.Fatalf("first fetch failing: %v, want a non-auth error", err)
	}
	t.Log(err)
	// Within MinRefresh no new attempt is made.
	_, _ = r.keys.PublicKey(ctx, kid)
	if n := r.fetches.Load(); n != 1 {
		t.Fatalf("%d fetch attempts within MinRefresh, want 1", n)
	}

	e.clock.Add(10 * time.Second)
	r.down.Store(false)
	if _, err := r.keys.PublicKey(ctx, kid); err != nil {
		t.Fatal(err)
	}

	// kontrol goes down and the cache ages past MaxAge: cached keys keep verifying.
	r.down.Store(true)
	e.clock.Add(time.Hour)
	if _, err := r.keys.PublicKey(ctx, kid); err != nil {
		t.Fatalf("cached key while kontrol is down: %v", err)
	}
	if _, err := r.keys.PublicKey(ctx, "other"); err == nil || errors.Is(err, kite.ErrAuth) {
		t.Errorf("unknown kid while kontrol is down: %v, want the fetch error", err)
	}
}

func TestRemoteKeysConcurrent(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	r := newRemote(e)
	kid := e.ring.Current().ID
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			if _, err := r.keys.PublicKey(ctx, kid); err != nil {
				t.Error(err)
			}
			if _, err := r.keys.PublicKey(ctx, "unknown"); !errors.Is(err, kitekey.ErrUnknownKey) {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if n := r.fetches.Load(); n != 1 {
		t.Errorf("%d fetches for 50 concurrent callers, want 1", n)
	}
}

func TestRemoteKeysRejectsBadKeys(t *testing.T) {
	e := newEnv(t)
	pk := e.ring.Public()[0]
	pk.ID = "not-its-kid"
	r := &kitekey.RemoteKeys{Now: e.clock.Now, Fetch: func(context.Context) ([]kitekey.PublicKey, error) {
		return []kitekey.PublicKey{pk}, nil
	}}
	if _, err := r.PublicKey(context.Background(), "not-its-kid"); err == nil {
		t.Error("accepted a key whose kid does not match it")
	}
}

func TestRemoteKeysContext(t *testing.T) {
	e := newEnv(t)
	block := make(chan struct{})
	started := make(chan struct{})
	r := &kitekey.RemoteKeys{Now: e.clock.Now, Fetch: func(ctx context.Context) ([]kitekey.PublicKey, error) {
		close(started)
		<-block
		return e.ring.Public(), nil
	}}
	done := make(chan error)
	go func() {
		_, err := r.PublicKey(context.Background(), e.ring.Current().ID)
		done <- err
	}()
	<-started
	// A second caller waiting for the fetch gives up when its context ends.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := r.PublicKey(ctx, e.ring.Current().ID); !errors.Is(err, context.Canceled) {
		t.Errorf("waiting caller with a cancelled context: %v", err)
	}
	close(block)
	if err := <-done; err != nil {
		t.Error(err)
	}
}
