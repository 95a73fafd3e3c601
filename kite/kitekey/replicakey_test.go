package kitekey_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
)

// TestReplicaKey: a replica key verifies as one and expires; only an authenticator with Replicas
// accepts it (whichever auth type it is presented as), as a restricted principal; no other kind
// passes for one. (kloud's TestReplicaMesh checks that Gate refuses it everywhere else.)
func TestReplicaKey(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	key, err := e.signer.ReplicaKey("r1.boot", 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	c, err := e.verifier.ReplicaKey(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if c.Replica != "r1.boot" || c.Subject != "replica:r1.boot" || !strings.HasPrefix(c.ID, kitekey.ReplicaIDPrefix) || c.Kind != kitekey.KindReplicaKey {
		t.Fatalf("claims %+v", c)
	}
	for _, ttl := range []time.Duration{0, -time.Second, 2 * time.Hour} {
		if _, err := e.signer.ReplicaKey("r1", ttl); !errors.Is(err, kite.ErrInvalidParams) {
			t.Errorf("ttl %s: %v, want invalid params", ttl, err)
		}
	}

	on := &kitekey.Authenticator{Verifier: e.verifier, Agents: true, Plugins: true, Replicas: true}
	off := &kitekey.Authenticator{Verifier: e.verifier, Agents: true, Plugins: true}
	for _, typ := range []string{kitekey.KindReplicaKey, kite.AuthKiteKey, kite.AuthSession} {
		p, err := on.Authenticate(ctx, kite.Identity{ID: "kloud"}, kite.Auth{Type: typ, Key: key})
		if err != nil || !kitekey.IsReplica(p) || kitekey.ReplicaName(p) != "r1.boot" || !kitekey.IsRestricted(p) || p.Admin {
			t.Errorf("presented as %s: %+v %v", typ, p, err)
		}
		if _, err := off.Authenticate(ctx, kite.Identity{ID: "kloud"}, kite.Auth{Type: typ, Key: key}); !errors.Is(err, kitekey.ErrWrongKind) {
			t.Errorf("presented as %s to a server without Replicas: %v, want wrong kind", typ, err)
		}
	}
	// Other kinds presented as a replica key.
	kk, err := e.signer.KiteKey("alice", "k1", "http://kontrol")
	if err != nil {
		t.Fatal(err)
	}
	plug, err := e.signer.PluginKey(kitekey.PluginKeySpec{Provider: "example"})
	if err != nil {
		t.Fatal(err)
	}
	sess, err := e.signer.Session("alice", true, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for _, raw := range []string{kk, plug, sess} {
		_, err := on.Authenticate(ctx, kite.Identity{ID: "kloud"}, kite.Auth{Type: kitekey.KindReplicaKey, Key: raw})
		mustReject(t, err, kitekey.ErrWrongKind)
	}

	e.clock.Add(10*time.Minute + time.Minute)
	_, err = e.verifier.ReplicaKey(ctx, key)
	mustReject(t, err, kitekey.ErrExpired)
}
