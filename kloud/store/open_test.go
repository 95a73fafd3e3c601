package store_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/kloud-dev/kloud/internal/testutil"

	"github.com/kloud-dev/kloud/kloud/store"
)

func openIn(t *testing.T, dir string) (*store.Store, error) {
	return store.Open(ctxT(t), store.Options{DataDir: dir, Logger: testutil.Logger(t)})
}

func closeStore(t *testing.T, s *store.Store) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Close(ctx); err != nil {
		t.Fatalf("close: %v", err)
	}
}

func TestReopenPersistsDataAndKey(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx := ctxT(t)

	s, err := openIn(t, dir)
	if err != nil {
		t.Fatal(err)
	}
	if !s.Embedded() {
		t.Fatal("store without MongoURL is not embedded")
	}
	fi, err := os.Stat(filepath.Join(dir, "secret.key"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 || fi.Size() != store.KeySize {
		t.Fatalf("secret.key: mode %v size %d, want 0600 and %d", fi.Mode().Perm(), fi.Size(), store.KeySize)
	}
	key1, _ := os.ReadFile(filepath.Join(dir, "secret.key"))
	sealed, err := s.Seal([]byte("hunter2"), []byte("credentials/c1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Collection(store.CollCredentials).InsertOne(ctx, bson.M{"_id": "c1", "owner": "alice", "secret": sealed}); err != nil {
		t.Fatal(err)
	}
	closeStore(t, s)
	if err := s.Close(ctx); err != nil {
		t.Fatalf("second close: %v", err)
	}

	s, err = openIn(t, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer closeStore(t, s)
	key2, _ := os.ReadFile(filepath.Join(dir, "secret.key"))
	if !bytes.Equal(key1, key2) {
		t.Fatal("secret key changed across reopen")
	}
	var doc struct {
		Owner  string `bson:"owner"`
		Secret []byte `bson:"secret"`
	}
	if err := s.Collection(store.CollCredentials).FindOne(ctx, bson.M{"_id": "c1"}).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	pt, err := s.Open(doc.Secret, []byte("credentials/c1"))
	if err != nil || string(pt) != "hunter2" || doc.Owner != "alice" {
		t.Fatalf("after reopen: owner %q secret %q err %v", doc.Owner, pt, err)
	}
}

func TestDataDirLockedWhileOpen(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, err := openIn(t, dir)
	if err != nil {
		t.Fatal(err)
	}
	_, err = openIn(t, dir)
	if !errors.Is(err, store.ErrLocked) {
		t.Fatalf("second open of a data dir in use: %v, want ErrLocked", err)
	}
	closeStore(t, s)
	s, err = openIn(t, dir)
	if err != nil {
		t.Fatalf("open after close: %v", err)
	}
	closeStore(t, s)
}

func TestWrongSecretKeyRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, err := openIn(t, dir)
	if err != nil {
		t.Fatal(err)
	}
	closeStore(t, s)
	other := bytes.Repeat([]byte{7}, store.KeySize)
	_, err = store.Open(ctxT(t), store.Options{DataDir: dir, SecretKey: other, Logger: testutil.Logger(t)})
	if err == nil {
		t.Fatal("open with another secret key succeeded")
	}
	t.Log(err)
	_, err = store.Open(ctxT(t), store.Options{DataDir: dir, SecretKey: []byte("short"), Logger: testutil.Logger(t)})
	if err == nil {
		t.Fatal("open with a short key succeeded")
	}
}

func TestLongDataDirUsesShortSocket(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "a-very-long-directory-name-to-push-the-socket-path-past-the-unix-limit", "and-then-some-more")
	s, err := openIn(t, dir)
	if err != nil {
		t.Fatal(err)
	}
	closeStore(t, s)
}

func TestMigrationsIdempotent(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, b backend) {
		ctx := ctxT(t)
		s := b.open(t, store.Options{})
		builtin := store.BuiltinMigrations()
		v, err := s.SchemaVersion(ctx)
		if err != nil || v != len(builtin) {
			t.Fatalf("schema version %d (%v), want %d", v, err, len(builtin))
		}
		names, err := s.Database().ListCollectionNames(ctx, bson.M{})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []string{store.CollUsers, store.CollTeams, store.CollCredentials, store.CollTemplates,
			store.CollStacks, store.CollMachines, store.CollJobs, store.CollLocks, store.CollKeys,
			store.CollRevocations, store.CollKites, store.CollSessions, store.CollMeta} {
			if !slices.Contains(names, c) {
				t.Errorf("collection %s missing (have %v)", c, names)
			}
		}

		// A further step runs once, however often migrate runs.
		runs := 0
		steps := append(slices.Clone(builtin), store.NewMigration(len(builtin)+1, "test step", func(ctx context.Context, s *store.Store) error {
			runs++
			_, err := s.Collection(store.CollMeta).UpdateOne(ctx, bson.M{"_id": "test"}, bson.M{"$inc": bson.M{"n": 1}})
			return err
		}))
		for range 3 {
			if err := store.Migrate(ctx, s, steps); err != nil {
				t.Fatal(err)
			}
		}
		if runs != 1 {
			t.Fatalf("step ran %d times, want 1", runs)
		}
		if v, _ := s.SchemaVersion(ctx); v != len(steps) {
			t.Fatalf("schema version %d, want %d", v, len(steps))
		}
		// An older kloud refuses a newer database.
		if err := store.Migrate(ctx, s, builtin); err == nil {
			t.Fatal("migrate with fewer steps than the database has succeeded")
		}
		// A failing step leaves the version where it was.
		bad := append(slices.Clone(steps), store.NewMigration(len(steps)+1, "fails", func(context.Context, *store.Store) error {
			return errors.New("boom")
		}))
		if err := store.Migrate(ctx, s, bad); err == nil {
			t.Fatal("failing step did not fail migrate")
		}
		if v, _ := s.SchemaVersion(ctx); v != len(steps) {
			t.Fatalf("schema version after failed step %d, want %d", v, len(steps))
		}
		if _, err := s.LeaseHolder(ctx, "kloud/migrate"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("migrate lease left behind: %v", err)
		}
	})
}

func TestUniqueIndexes(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, b backend) {
		ctx := ctxT(t)
		s := b.open(t, store.Options{})
		users := s.Collection(store.CollUsers)
		if _, err := users.InsertOne(ctx, bson.M{"_id": store.NewID(), "username": "alice"}); err != nil {
			t.Fatal(err)
		}
		_, err := users.InsertOne(ctx, bson.M{"_id": store.NewID(), "username": "alice"})
		if !store.IsDuplicateKey(err) {
			t.Fatalf("second user alice: %v, want duplicate key", err)
		}
		teams := s.Collection(store.CollTeams)
		if _, err := teams.InsertOne(ctx, bson.M{"_id": store.NewID(), "slug": "t"}); err != nil {
			t.Fatal(err)
		}
		if _, err := teams.InsertOne(ctx, bson.M{"_id": store.NewID(), "slug": "t"}); !store.IsDuplicateKey(err) {
			t.Fatalf("second team t: %v, want duplicate key", err)
		}
	})
}
