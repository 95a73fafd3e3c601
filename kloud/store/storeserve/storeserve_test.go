package storeserve_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/kloud/store/storeserve"
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

// What a client of kloud store serve meets besides plain commands: the socket is its user's
// only (0600); a kloud cannot open the served data directory (the same lock); a cursor is read
// in several batches (getMore) and killed early (killCursors) through the proxy; a transaction
// is refused with a clear error; endSessions (at disconnect) is answered.
func TestServeProtocolEdges(t *testing.T) {
	srv := storetest.StartServe(t)
	fi, err := os.Stat(srv.Socket)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 || fi.Mode()&os.ModeSocket == 0 {
		t.Errorf("socket mode %v, want a 0600 socket", fi.Mode())
	}

	ctx := context.Background()
	_, err = store.Open(ctx, store.Options{DataDir: srv.DataDir})
	if !errors.Is(err, store.ErrLocked) {
		t.Errorf("a kloud's embedded store on the served data directory: %v, want ErrLocked", err)
	}

	c, err := mongo.Connect(options.Client().ApplyURI(srv.URL))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Disconnect(ctx)
	coll := c.Database("edges").Collection("docs")
	var docs []any
	for i := range 25 {
		docs = append(docs, bson.M{"_id": fmt.Sprintf("d%02d", i), "n": i})
	}
	if _, err := coll.InsertMany(ctx, docs); err != nil {
		t.Fatal(err)
	}
	cur, err := coll.Find(ctx, bson.M{}, options.Find().SetBatchSize(4).SetSort(bson.M{"_id": 1}))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for cur.Next(ctx) {
		n++
	}
	if err := cur.Err(); err != nil || n != 25 {
		t.Errorf("read %d of 25 documents in batches of 4: %v", n, err)
	}
	cur.Close(ctx)
	cur, err = coll.Find(ctx, bson.M{}, options.Find().SetBatchSize(2))
	if err != nil {
		t.Fatal(err)
	}
	if !cur.Next(ctx) {
		t.Fatal("no first document")
	}
	if err := cur.Close(ctx); err != nil { // killCursors
		t.Errorf("kill a cursor: %v", err)
	}

	sess, err := c.StartSession()
	if err != nil {
		t.Fatal(err)
	}
	_, err = sess.WithTransaction(ctx, func(ctx context.Context) (any, error) {
		return coll.InsertOne(ctx, bson.M{"_id": "tx"})
	})
	sess.EndSession(ctx)
	if err == nil || !strings.Contains(err.Error(), "not supported by kloud store serve") {
		t.Errorf("a transaction: %v, want refused", err)
	}
	if n, err := coll.CountDocuments(ctx, bson.M{"_id": "tx"}); err != nil || n != 0 {
		t.Errorf("the refused transaction's insert: %d documents, %v", n, err)
	}

	// After all that, the connection still serves commands.
	if err := c.Ping(ctx, nil); err != nil {
		t.Errorf("ping: %v", err)
	}
}

// TCP is TLS with verified client certificates, or nothing.
func TestServeRefusesTCPWithoutClientCertificates(t *testing.T) {
	for _, cfg := range []*tls.Config{nil, {}, {ClientAuth: tls.RequireAndVerifyClientCert}} {
		_, err := storeserve.New(storeserve.Options{DataDir: t.TempDir(), TCP: "127.0.0.1:0", TLS: cfg})
		if err == nil || !strings.Contains(err.Error(), "client certificates") {
			t.Errorf("TCP with TLS %+v: %v, want refused", cfg, err)
		}
	}
}
