package store_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/kloud/store/storetest"
)

// backend is one database the suite runs against.
type backend struct {
	name string
	open func(t *testing.T, opts store.Options) *store.Store
}

// backends returns the embedded FerretDB always, and the MongoDB at KLOUD_TEST_MONGO_URL when
// that is set (each test gets its own database, dropped afterwards).
func backends(t *testing.T) []backend {
	bs := []backend{{"embedded", func(t *testing.T, opts store.Options) *store.Store {
		return storetest.Open(t, opts)
	}}}
	if url := os.Getenv("KLOUD_TEST_MONGO_URL"); url != "" {
		bs = append(bs, backend{"mongo", func(t *testing.T, opts store.Options) *store.Store {
			opts.MongoURL = url
			if opts.Database == "" {
				opts.Database = fmt.Sprintf("kloudtest_%s", store.NewID())
				t.Cleanup(func() { dropDatabase(t, url, opts.Database) })
			}
			return storetest.Open(t, opts)
		}})
	}
	return bs
}

func dropDatabase(t *testing.T, url, db string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := mongo.Connect(options.Client().ApplyURI(url))
	if err != nil {
		t.Errorf("drop %s: %v", db, err)
		return
	}
	defer c.Disconnect(ctx)
	if err := c.Database(db).Drop(ctx); err != nil {
		t.Errorf("drop %s: %v", db, err)
	}
}

// forEach runs f as a subtest per backend.
func forEach(t *testing.T, f func(t *testing.T, b backend)) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) { f(t, b) })
	}
}

// clock is a settable clock for Options.Now.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func storetestNew(t *testing.T) *store.Store { return storetest.New(t) }

// mustDoc is v as a job's params or result.
func mustDoc(t testing.TB, v any) store.Doc {
	t.Helper()
	d, err := store.EncodeDoc(v)
	if err != nil {
		t.Fatal(err)
	}
	return d
}
