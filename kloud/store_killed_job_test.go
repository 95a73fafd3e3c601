package kloud_test

import (
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store/storetest"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/dummy"
)

// TestStoreKilledMidJob: kloud on an external database (--mongo-url) that dies while a build
// runs (terraform applying, then the agents awaited) and comes back on the same data a few
// seconds later: the build goes on and ends as asked (issue 23), with its machines Running and
// the stack Initialized; kloud retries its writes rather than failing the job.
func TestStoreKilledMidJob(t *testing.T) {
	t.Parallel()
	db := storetest.NewServer(t)
	f := newFlowWith(t, dummy.Options{}, kloudtest.Options{MongoURL: db.URL})
	f.credential()
	tid := f.template(twoVMs)
	sid, _ := f.stack(tid)
	c := f.client()
	job, err := c.StackApply(t.Context(), api.StackApplyParams{StackID: sid})
	if err != nil {
		t.Fatal(err)
	}
	// Kill the store once terraform runs.
	testutil.Eventually(t, 2*time.Minute, func() bool {
		j, err := c.JobGet(t.Context(), api.JobRef{JobID: job.JobID})
		if err != nil || j.Status.Done() {
			if err == nil {
				t.Fatalf("the build ended before the store could be killed: %+v", j)
			}
			return false
		}
		return j.Percent >= 40
	}, "the build did not reach terraform")
	db.Stop()
	t.Log("store killed")
	time.Sleep(6 * time.Second)
	db.Start()
	t.Log("store back")
	// The driver's one connection comes back by itself, within seconds: until then a read may
	// fail ("timed out while checking out a connection from connection pool", ci50), as a
	// user's job.watch would, and be made again. The job is what this test is about: its
	// writes are retried.
	var last api.JobEvent
	for try := 1; ; try++ {
		if last, err = f.followErr(job.JobID); err == nil {
			break
		}
		if try == 10 {
			t.Fatal(err)
		}
		t.Logf("while the store comes back: %v; again in 2s", err)
		time.Sleep(2 * time.Second)
	}
	if last.Status != "succeeded" {
		t.Fatalf("build across a store outage: %+v", last)
	}
	for l, m := range f.machines(sid) {
		if m.State != provider.Running || m.Agent.Status != model.AgentConnected {
			t.Errorf("%s after the build: %+v", l, m)
		}
	}
	st, err := c.StackDescribe(t.Context(), api.StackRef{StackID: sid})
	if err != nil || st.Stack.State != model.StackInitialized {
		t.Fatalf("stack after the build: %+v %v", st, err)
	}
}
