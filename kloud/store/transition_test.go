package store_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/kloud-dev/kloud/kloud/store"
)

func TestTransitionAppliesOnce(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, b backend) {
		ctx := ctxT(t)
		s := b.open(t, store.Options{})
		machines := s.Collection(store.CollMachines)
		const racers, rounds = 8, 30
		for round := range rounds {
			id := fmt.Sprintf("m%d", round)
			if _, err := machines.InsertOne(ctx, bson.M{"_id": id, "stackId": "s1", "state": "Stopped"}); err != nil {
				t.Fatal(err)
			}
			var wins atomic.Int32
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range racers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					ok, err := s.Transition(ctx, store.CollMachines, id, []string{"Stopped"},
						bson.M{"state": "Starting", "by": fmt.Sprint(i)})
					if err != nil {
						t.Error(err)
					}
					if ok {
						wins.Add(1)
					}
				}()
			}
			close(start)
			wg.Wait()
			if wins.Load() != 1 {
				t.Fatalf("round %d: %d transitions applied, want 1", round, wins.Load())
			}
		}
		var m bson.M
		if err := machines.FindOne(ctx, bson.M{"_id": "m0"}).Decode(&m); err != nil {
			t.Fatal(err)
		}
		if m["state"] != "Starting" || m["updatedAt"] == nil {
			t.Fatalf("machine after transition: %v", m)
		}
		ok, err := s.Transition(ctx, store.CollMachines, "m0", []string{"Stopped", "Running"}, bson.M{"state": "Stopping"})
		if err != nil || ok {
			t.Fatalf("transition from a state the machine is not in: %v %v", ok, err)
		}
		ok, err = s.Transition(ctx, store.CollMachines, "nope", []string{"Starting"}, bson.M{"state": "Running"})
		if err != nil || ok {
			t.Fatalf("transition of a missing machine: %v %v", ok, err)
		}
		ok, err = s.Transition(ctx, store.CollMachines, "m0", []string{"Stopped", "Starting"}, bson.M{"state": "Running"})
		if err != nil || !ok {
			t.Fatalf("transition from one of several states: %v %v", ok, err)
		}
	})
}
