package storeserve_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/kloud/store/storetest"
)

// Two stores (as two kloud replicas: their own data directories, one secret key, one
// database) share a `kloud store serve` with pooled connections: each sees the other's writes,
// and of their goroutines racing for one lease in each round exactly one wins.
func TestServeSharedByTwoStores(t *testing.T) {
	url := storetest.Serve(t)
	key := bytes.Repeat([]byte{7}, 32)
	a := storetest.Open(t, store.Options{MongoURL: url, Database: "replicas", SecretKey: key})
	b := storetest.Open(t, store.Options{MongoURL: url, Database: "replicas", SecretKey: key})
	ctx := context.Background()

	if _, err := a.Collection("probe").InsertOne(ctx, bson.M{"_id": "x", "by": "a"}); err != nil {
		t.Fatal(err)
	}
	var got bson.M
	if err := b.Collection("probe").FindOne(ctx, bson.M{"_id": "x"}).Decode(&got); err != nil || got["by"] != "a" {
		t.Fatalf("b reads a's write: %v %v", got, err)
	}

	const rounds, racers = 20, 4
	for r := range rounds {
		var mu sync.Mutex
		var winners []string
		var wg sync.WaitGroup
		for i := range racers {
			for name, s := range map[string]*store.Store{"a": a, "b": b} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					owner := fmt.Sprintf("%s%d", name, i)
					_, err := s.AcquireLease(ctx, fmt.Sprintf("round-%d", r), owner, time.Hour)
					switch {
					case err == nil:
						mu.Lock()
						winners = append(winners, owner)
						mu.Unlock()
					case !errors.Is(err, store.ErrLocked):
						t.Errorf("acquire: %v", err)
					}
				}()
			}
		}
		wg.Wait()
		if len(winners) != 1 {
			t.Fatalf("round %d: %d winners %v, want exactly one", r, len(winners), winners)
		}
	}
}
