package store_test

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/kloud/store/storetest"
)

// Benchmarks of single operations on the embedded store, for the numbers in reports and
// bench/RESULTS.md. Run: go test ./kloud/store -run '^$' -bench . -benchtime 200x

func BenchmarkOpenClose(b *testing.B) {
	for b.Loop() {
		dir := b.TempDir()
		s, err := store.Open(b.Context(), store.Options{DataDir: dir})
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Close(b.Context()); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAcquireRelease(b *testing.B) {
	s := storetest.Open(b, store.Options{Logger: slog.New(slog.DiscardHandler)})
	ctx := b.Context()
	for b.Loop() {
		l, err := s.AcquireLease(ctx, "stack/s1", "r1", time.Minute)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkTransition(b *testing.B) {
	s := storetest.Open(b, store.Options{Logger: slog.New(slog.DiscardHandler)})
	ctx := b.Context()
	s.Collection(store.CollMachines).InsertOne(ctx, bson.M{"_id": "m", "state": "Stopped"})
	states := [2]string{"Stopped", "Running"}
	i := 0
	for b.Loop() {
		ok, err := s.Transition(ctx, store.CollMachines, "m", []string{states[i%2]}, bson.M{"state": states[(i+1)%2]})
		if err != nil || !ok {
			b.Fatal(ok, err)
		}
		i++
	}
}

func BenchmarkJobProgress(b *testing.B) {
	s := storetest.Open(b, store.Options{Logger: slog.New(slog.DiscardHandler)})
	ctx := b.Context()
	id, _ := s.Jobs().Create(ctx, store.Job{Kind: "k", Target: "stack/s"})
	s.Jobs().Start(ctx, id, "r")
	i := 0
	for b.Loop() {
		if err := s.Jobs().Progress(ctx, id, i%100, "Building", "step"); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

func BenchmarkJobLogFull(b *testing.B) {
	s := storetest.Open(b, store.Options{Logger: slog.New(slog.DiscardHandler)})
	ctx := b.Context()
	id, _ := s.Jobs().Create(ctx, store.Job{Kind: "k", Target: "stack/s"})
	s.Jobs().Start(ctx, id, "r")
	for i := range 500 {
		s.Jobs().Log(ctx, id, fmt.Sprintf("terraform: line %d of plausible length for an apply log output", i))
	}
	b.ResetTimer()
	for b.Loop() {
		if err := s.Jobs().Log(ctx, id, "aws_instance.m: Still creating... [10s elapsed]"); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkJobGet(b *testing.B) {
	s := storetest.Open(b, store.Options{Logger: slog.New(slog.DiscardHandler)})
	ctx := b.Context()
	id, _ := s.Jobs().Create(ctx, store.Job{Kind: "k", Target: "stack/s"})
	for b.Loop() {
		if _, err := s.Jobs().Get(ctx, id); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTransitionLarge shows the cost of FerretDB v1's full scans: a conditional update in
// a collection of 2000 machines.
func BenchmarkTransitionLarge(b *testing.B) {
	s := storetest.Open(b, store.Options{Logger: slog.New(slog.DiscardHandler)})
	ctx := b.Context()
	docs := make([]any, 2000)
	for i := range docs {
		docs[i] = bson.M{"_id": fmt.Sprintf("m%d", i), "state": "Stopped", "stackId": "s"}
	}
	if _, err := s.Collection(store.CollMachines).InsertMany(ctx, docs); err != nil {
		b.Fatal(err)
	}
	states := [2]string{"Stopped", "Running"}
	i := 0
	b.ResetTimer()
	for b.Loop() {
		ok, err := s.Transition(ctx, store.CollMachines, "m1000", []string{states[i%2]}, bson.M{"state": states[(i+1)%2]})
		if err != nil || !ok {
			b.Fatal(ok, err)
		}
		i++
	}
}

func BenchmarkKitesFind(b *testing.B) {
	s := storetest.Open(b, store.Options{Logger: slog.New(slog.DiscardHandler)})
	ctx := b.Context()
	for i := range 50 {
		s.Kites().Upsert(ctx, store.KiteRecord{ID: fmt.Sprintf("k%d", i), Username: fmt.Sprintf("u%d", i%5), Name: "klient", Replica: "r"})
	}
	for b.Loop() {
		if _, err := s.Kites().Find(ctx, map[string]string{"username": "u1", "name": "klient"}); err != nil {
			b.Fatal(err)
		}
	}
}

// The change log of several replicas (changelog.go), holding n entries (n/Keep is the log's
// size: 2 min of changes): an idle poll (the entry waited for is not there yet: one read by
// _id), an append, an entry read by seq (what a replica does once something is there), and a
// range read (which only a replica looking past a gap makes).
func BenchmarkChangeLog(b *testing.B) {
	for _, n := range []int{100, 2000} {
		s := storetest.Open(b, store.Options{Logger: slog.New(slog.DiscardHandler)})
		ctx := b.Context()
		log := s.ChangeLog()
		body := `{"event":{"topics":["machines"],"kind":"machine","id":"0123456789abcdef01234567","op":"changed","at":"2026-01-01T00:00:00Z","owner":"alice","team":"default"}}`
		bodies := make([]string, n)
		for i := range bodies {
			bodies[i] = body
		}
		seqs, err := log.Append(ctx, 1, "r1", bodies...)
		if err != nil {
			b.Fatal(err)
		}
		head := seqs[len(seqs)-1]
		b.Run(fmt.Sprintf("idle-poll/%d", n), func(b *testing.B) {
			for b.Loop() {
				if _, err := log.Get(ctx, head+1); err == nil {
					b.Fatal("found an entry past the head")
				}
			}
		})
		b.Run(fmt.Sprintf("read-one/%d", n), func(b *testing.B) {
			for b.Loop() {
				if _, err := log.Get(ctx, head-5); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("read-range/%d", n), func(b *testing.B) {
			for b.Loop() {
				if es, err := log.From(ctx, head-9, 256); err != nil || len(es) != 10 {
					b.Fatal(len(es), err)
				}
			}
		})
		b.Run(fmt.Sprintf("append/%d", n), func(b *testing.B) {
			for b.Loop() {
				if seqs, err = log.Append(ctx, head+1, "r1", body); err != nil {
					b.Fatal(err)
				}
				head = seqs[0]
			}
		})
	}
}
