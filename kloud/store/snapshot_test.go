package store_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/kloud/store/storetest"
)

// TestSnapshot takes a snapshot of the embedded store while another goroutine inserts users
// u0, u1, … one after the other; a store opened on the copy (with the secret key) holds exactly
// u0..uk for some k, no gap (one instant of the database), and opens what was sealed. A
// snapshot onto an existing file is refused.
func TestSnapshot(t *testing.T) {
	dir := t.TempDir()
	s, err := openIn(t, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer closeStore(t, s)
	ctx := ctxT(t)
	sealed, err := s.Seal([]byte("a secret"), []byte("test/1"))
	if err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	done := make(chan int)
	go func() {
		n := 0
		for ; !stop.Load() || n < 20; n++ {
			if err := s.Users().Insert(ctx, model.User{Username: fmt.Sprintf("u%05d", n), CreatedAt: s.Now()}); err != nil {
				t.Error(err)
				break
			}
		}
		done <- n
	}()
	for {
		us, err := s.Users().List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(us) >= 5 {
			break
		}
	}
	out := t.TempDir()
	snap := filepath.Join(out, "db", store.DatabaseFile(""))
	os.MkdirAll(filepath.Dir(snap), 0o700)
	err = s.Snapshot(ctx, snap)
	stop.Store(true)
	inserted := <-done
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Snapshot(ctx, snap); err == nil {
		t.Error("a snapshot onto an existing file was not refused")
	}
	key, _ := os.ReadFile(filepath.Join(dir, store.SecretKeyFile))
	os.WriteFile(filepath.Join(out, store.SecretKeyFile), key, 0o600)
	r, err := openIn(t, out)
	if err != nil {
		t.Fatal(err)
	}
	defer closeStore(t, r)
	us, err := r.Users().List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(us) < 5 || len(us) > inserted {
		t.Fatalf("%d users in the snapshot, %d inserted", len(us), inserted)
	}
	for i, u := range us {
		if u.Username != fmt.Sprintf("u%05d", i) {
			t.Fatalf("user %d of the snapshot is %s: a gap (not one instant)", i, u.Username)
		}
	}
	if pt, err := r.Open(sealed, []byte("test/1")); err != nil || string(pt) != "a secret" {
		t.Errorf("sealed value in the copy: %q, %v", pt, err)
	}
	if _, err := store.OpenWithKey(key, sealed, []byte("test/1")); err != nil {
		t.Errorf("OpenWithKey: %v", err)
	}
	t.Logf("snapshot holds %d of %d users", len(us), inserted)
}

// TestSnapshotExternal: a store on an external server (--mongo-url; here a FerretDB server apart
// from the store) has no snapshot here: the error wraps errors.ErrUnsupported and names mongodump.
func TestSnapshotExternal(t *testing.T) {
	srv := storetest.NewServer(t)
	s := storetest.Open(t, store.Options{MongoURL: srv.URL, DataDir: t.TempDir()})
	err := s.Snapshot(ctxT(t), filepath.Join(t.TempDir(), "x"))
	if !errors.Is(err, errors.ErrUnsupported) || !strings.Contains(err.Error(), "mongodump") {
		t.Errorf("snapshot of an external store: %v", err)
	}
}

// TestDoctorChecks: the atomicity check passes on the embedded store (twice: the scratch
// document exists the second time) and its updates add up; the server time is the store's clock.
func TestDoctorChecks(t *testing.T) {
	s := storetest.New(t)
	ctx := ctxT(t)
	for range 2 {
		if err := s.AtomicCheck(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var doc struct {
		N int64 `bson:"n"`
	}
	if err := s.Collection(store.CollMeta).FindOne(ctx, bson.M{"_id": "doctor"}).Decode(&doc); err != nil || doc.N != 16 {
		t.Errorf("scratch document after two checks: n=%d (want 16), %v", doc.N, err)
	}
	before := time.Now()
	st, err := s.ServerTime(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Before(before.Add(-time.Second)) || st.After(time.Now().Add(time.Second)) {
		t.Errorf("server time %s, local %s", st, before)
	}
}
