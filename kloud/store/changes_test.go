package store_test

import (
	"sync"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store"
)

// TestOnChange: Options.OnChange is told of each write to machines, stacks and jobs after it
// succeeded, naming the documents; a conditional write that did not apply tells nothing; a
// delete carries what it removed and a share change the machine as it was.
func TestOnChange(t *testing.T) {
	forEach(t, func(t *testing.T, b backend) {
		var mu sync.Mutex
		var got []store.Change
		s := b.open(t, store.Options{OnChange: func(c store.Change) {
			mu.Lock()
			got = append(got, c)
			mu.Unlock()
		}})
		take := func() []store.Change {
			mu.Lock()
			defer mu.Unlock()
			out := got
			got = nil
			return out
		}
		ctx := t.Context()
		now := time.Now()
		m := model.Machine{ID: "m1", StackID: "s1", Label: "a", Owner: "alice", Team: "t", State: "Running", KiteID: "agent.k1",
			Shares: []model.Share{{Username: "bob", Grant: model.GrantTerminal}}, CreatedAt: now, UpdatedAt: now}
		if err := s.Machines().InsertMany(ctx, []model.Machine{m}); err != nil {
			t.Fatal(err)
		}
		if c := take(); len(c) != 1 || c[0].Coll != store.CollMachines || c[0].ID != "m1" {
			t.Fatalf("insert: %+v", c)
		}
		if ok, err := s.Machines().Transition(ctx, "m1", []string{"Stopped"}, store.MachineSet{State: new("Starting")}); ok || err != nil {
			t.Fatalf("transition from the wrong state: %v %v", ok, err)
		}
		if c := take(); len(c) != 0 {
			t.Fatalf("a transition that did not apply told %+v", c)
		}
		if ok, err := s.Machines().Transition(ctx, "m1", []string{"Running"}, store.MachineSet{State: new("Stopping")}); !ok || err != nil {
			t.Fatalf("transition: %v %v", ok, err)
		}
		if c := take(); len(c) != 1 || c[0].ID != "m1" || c[0].Deleted {
			t.Fatalf("transition: %+v", c)
		}
		cur, err := s.Machines().Get(ctx, "m1")
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := s.Machines().SetShares(ctx, "m1", cur.UpdatedAt, nil); !ok || err != nil {
			t.Fatalf("set shares: %v %v", ok, err)
		}
		c := take()
		if before, _ := c[0].Gone.([]model.Machine); len(c) != 1 || c[0].Field != "shares" || len(before) != 1 || len(before[0].Shares) != 1 {
			t.Fatalf("set shares: %+v, want the machine as it was (shared with bob)", c)
		}
		if err := s.Machines().SetAgent(ctx, "agent.k1", model.AgentConnected, "1"); err != nil {
			t.Fatal(err)
		}
		if c := take(); len(c) != 1 || c[0].KiteID != "agent.k1" || c[0].Field != "agent" {
			t.Fatalf("set agent: %+v", c)
		}
		if err := s.Machines().SetAgent(ctx, "agent.nobody", model.AgentConnected, "1"); err != nil {
			t.Fatal(err)
		}
		if c := take(); len(c) != 0 {
			t.Fatalf("the agent of no machine told %+v", c)
		}
		if err := s.Machines().DeleteByStack(ctx, "s1"); err != nil {
			t.Fatal(err)
		}
		if c := take(); len(c) != 1 || !c[0].Deleted || c[0].StackID != "s1" || len(c[0].Gone.([]model.Machine)) != 1 {
			t.Fatalf("delete by stack: %+v", c)
		}
		if err := s.Stacks().Insert(ctx, model.Stack{ID: "s1", Owner: "alice", Team: "t", State: "NotInitialized", CreatedAt: now, UpdatedAt: now}); err != nil {
			t.Fatal(err)
		}
		if err := s.Stacks().Delete(ctx, "s1"); err != nil {
			t.Fatal(err)
		}
		if c := take(); len(c) != 2 || c[0].ID != "s1" || !c[1].Deleted || c[1].Gone.(model.Stack).Owner != "alice" {
			t.Fatalf("stack insert and delete: %+v", c)
		}
		id, err := s.Jobs().Create(ctx, store.Job{Kind: "k", Target: "stack/s1", Owner: "alice"})
		if err != nil {
			t.Fatal(err)
		}
		if c := take(); len(c) != 1 || c[0].Coll != store.CollJobs || c[0].Job == nil || c[0].Job.ID != id || c[0].Job.Owner != "alice" {
			t.Fatalf("job create: %+v", c)
		}
	})
}
