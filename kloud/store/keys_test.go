package store_test

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/kloud-dev/kloud/kloud/store"
)

func TestKeys(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, b backend) {
		ctx := ctxT(t)
		clk := newClock()
		s := b.open(t, store.Options{Now: clk.Now})
		keys := s.Keys()

		if l, err := keys.List(ctx); err != nil || len(l) != 0 {
			t.Fatalf("empty list: %v %v", l, err)
		}
		pub1, priv1, _ := ed25519.GenerateKey(nil)
		if err := keys.Add(ctx, store.KeyRecord{ID: "k1", Alg: "EdDSA", Public: pub1, Private: priv1}); err != nil {
			t.Fatal(err)
		}
		clk.Advance(time.Hour)
		pub2, priv2, _ := ed25519.GenerateKey(nil)
		if err := keys.Add(ctx, store.KeyRecord{ID: "k2", Alg: "EdDSA", Public: pub2, Private: priv2}); err != nil {
			t.Fatal(err)
		}
		if err := keys.Add(ctx, store.KeyRecord{ID: "k2", Alg: "EdDSA", Public: pub2, Private: priv2}); !errors.Is(err, store.ErrConflict) {
			t.Fatalf("duplicate kid: %v", err)
		}

		// The private half is sealed at rest.
		var raw bson.M
		if err := s.Collection(store.CollKeys).FindOne(ctx, bson.M{"_id": "k1"}).Decode(&raw); err != nil {
			t.Fatal(err)
		}
		for k, v := range raw {
			if bin, ok := v.(bson.Binary); ok && bytes.Contains(bin.Data, priv1.Seed()) {
				t.Fatalf("field %s holds the private key in the clear", k)
			}
		}

		at := clk.Now().Add(time.Minute)
		if err := keys.Retire(ctx, "k1", at); err != nil {
			t.Fatal(err)
		}
		if err := keys.Retire(ctx, "k1", at.Add(time.Hour)); err != nil {
			t.Fatalf("retire again: %v", err)
		}
		if err := keys.Retire(ctx, "nope", at); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("retire missing: %v", err)
		}
		l, err := keys.List(ctx)
		if err != nil || len(l) != 2 {
			t.Fatalf("list: %v %v", l, err)
		}
		if l[0].ID != "k1" || !bytes.Equal(l[0].Private, priv1) || !bytes.Equal(l[0].Public, pub1) ||
			l[0].RetiredAt == nil || !l[0].RetiredAt.Equal(at) || l[0].Alg != "EdDSA" {
			t.Fatalf("k1: %+v", l[0])
		}
		if l[1].ID != "k2" || !bytes.Equal(l[1].Private, priv2) || l[1].RetiredAt != nil || !l[1].CreatedAt.Equal(clk.Now()) {
			t.Fatalf("k2: %+v", l[1])
		}
		// A signature made with the stored key verifies with its public half.
		sig := ed25519.Sign(ed25519.PrivateKey(l[1].Private), []byte("msg"))
		if !ed25519.Verify(ed25519.PublicKey(l[1].Public), []byte("msg"), sig) {
			t.Fatal("stored key pair does not verify")
		}

		// A sealed private key moved to another key id does not open.
		var k2 bson.M
		s.Collection(store.CollKeys).FindOne(ctx, bson.M{"_id": "k2"}).Decode(&k2)
		s.Collection(store.CollKeys).UpdateOne(ctx, bson.M{"_id": "k1"}, bson.M{"$set": bson.M{"privateSealed": k2["privateSealed"]}})
		if _, err := keys.List(ctx); err == nil {
			t.Fatal("list opened a private key swapped in from another kid")
		}
		if err := keys.Delete(ctx, "k1"); err != nil {
			t.Fatal(err)
		}
		if err := keys.Delete(ctx, "k1"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("delete twice: %v", err)
		}
	})
}

func TestRevocations(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, b backend) {
		ctx := ctxT(t)
		clk := newClock()
		s := b.open(t, store.Options{Now: clk.Now})
		rv := s.Revocations()

		if ok, err := rv.IsRevoked(ctx, "j1"); err != nil || ok {
			t.Fatalf("not yet revoked: %v %v", ok, err)
		}
		if err := rv.Revoke(ctx, "j1", clk.Now().Add(time.Hour), "token leaked"); err != nil {
			t.Fatal(err)
		}
		clk.Advance(time.Second)
		if err := rv.Revoke(ctx, "kite-1", time.Time{}, "machine destroyed"); err != nil {
			t.Fatal(err)
		}
		if err := rv.Revoke(ctx, "kite-1", time.Time{}, "machine destroyed"); err != nil {
			t.Fatalf("revoke twice: %v", err)
		}
		for _, jti := range []string{"j1", "kite-1"} {
			if ok, err := rv.IsRevoked(ctx, jti); err != nil || !ok {
				t.Fatalf("%s revoked: %v %v", jti, ok, err)
			}
		}
		l, err := rv.ListRevoked(ctx)
		if err != nil || len(l) != 2 || l[0].JTI != "j1" || l[0].Reason != "token leaked" ||
			!l[0].Until.Equal(clk.Now().Add(time.Hour-time.Second)) || l[1].JTI != "kite-1" || !l[1].Until.IsZero() {
			t.Fatalf("list: %+v %v", l, err)
		}
		// Pruning forgets expired revocations, never permanent ones.
		if n, err := rv.Prune(ctx, clk.Now().Add(365*24*time.Hour), store.PruneOptions{}); err != nil || n != 1 {
			t.Fatalf("prune: %d %v", n, err)
		}
		if ok, _ := rv.IsRevoked(ctx, "kite-1"); !ok {
			t.Fatal("permanent revocation pruned")
		}
		if ok, _ := rv.IsRevoked(ctx, "j1"); ok {
			t.Fatal("expired revocation kept")
		}
	})
}
