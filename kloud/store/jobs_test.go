package store_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/kloud/store/storetest"
)

// collect reads w until it closes.
func collect(t *testing.T, w <-chan store.Job) []store.Job {
	t.Helper()
	var got []store.Job
	timeout := time.After(time.Minute)
	for {
		select {
		case j, ok := <-w:
			if !ok {
				return got
			}
			got = append(got, j)
		case <-timeout:
			t.Fatalf("watch did not close; got %d states", len(got))
		}
	}
}

func TestJobLifecycleAndWatch(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, b backend) {
		ctx := ctxT(t)
		s := b.open(t, store.Options{})
		js := s.Jobs()
		id, err := js.Create(ctx, store.Job{Kind: "stack.apply", Target: "stack/s1", Owner: "alice",
			Params: mustDoc(t, map[string]any{"destroy": false, "nested": map[string]any{"a": "b"}})})
		if err != nil {
			t.Fatal(err)
		}
		w, err := js.Watch(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan []store.Job)
		go func() { done <- collect(t, w) }()

		if _, err := js.Start(ctx, id, "replica-1"); err != nil {
			t.Fatal(err)
		}
		if err := js.Progress(ctx, id, 10, "Building", "terraform init"); err != nil {
			t.Fatal(err)
		}
		if err := js.Log(ctx, id, "line 1", "line 2"); err != nil {
			t.Fatal(err)
		}
		if err := js.Progress(ctx, id, 150, "Building", "terraform apply"); err != nil {
			t.Fatal(err)
		}
		if err := js.Finish(ctx, id, nil, mustDoc(t, map[string]any{"machines": 2})); err != nil {
			t.Fatal(err)
		}
		got := <-done

		type step struct {
			status  store.JobStatus
			percent int
			msg     string
			logSeq  int64
		}
		want := []step{
			{store.JobQueued, 0, "", 0},
			{store.JobRunning, 0, "", 0},
			{store.JobRunning, 10, "terraform init", 0},
			{store.JobRunning, 10, "terraform init", 2},
			{store.JobRunning, 100, "terraform apply", 2},
			{store.JobSucceeded, 100, "terraform apply", 2},
		}
		var have []step
		for i, j := range got {
			have = append(have, step{j.Status, j.Percent, j.Message, j.LogSeq})
			if j.Rev != int64(i+1) {
				t.Errorf("state %d has rev %d", i, j.Rev)
			}
		}
		if !slices.Equal(have, want) {
			t.Fatalf("watched states\n got %+v\nwant %+v", have, want)
		}

		j, err := js.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if j.Kind != "stack.apply" || j.Target != "stack/s1" || j.Owner != "alice" || j.Runner != "replica-1" ||
			j.Attempt != 1 || j.Stage != "Building" || j.Result.Map()["machines"] == nil || j.FinishedAt.IsZero() ||
			j.Params.Map()["nested"].(map[string]any)["a"] != "b" || !slices.Equal(j.Log, []string{"line 1", "line 2"}) {
			t.Fatalf("final job: %+v", j)
		}

		// Finished is final.
		if err := js.Finish(ctx, id, errors.New("again"), store.Doc{}); !errors.Is(err, store.ErrState) {
			t.Fatalf("finish twice: %v", err)
		}
		if err := js.Progress(ctx, id, 1, "", ""); !errors.Is(err, store.ErrState) {
			t.Fatalf("progress after finish: %v", err)
		}
		if err := js.Log(ctx, id, "late"); !errors.Is(err, store.ErrState) {
			t.Fatalf("log after finish: %v", err)
		}
		if _, err := js.Start(ctx, id, "replica-2"); !errors.Is(err, store.ErrState) {
			t.Fatalf("start after finish: %v", err)
		}
		if _, err := js.Get(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("get missing: %v", err)
		}
		if _, err := js.Watch(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("watch missing: %v", err)
		}
		// Watching a finished job gives its final state and closes.
		w, err = js.Watch(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if got := collect(t, w); len(got) != 1 || got[0].Status != store.JobSucceeded {
			t.Fatalf("watch of a finished job: %+v", got)
		}
	})
}

func TestJobFailAndCancel(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, b backend) {
		ctx := ctxT(t)
		s := b.open(t, store.Options{})
		js := s.Jobs()

		failed, _ := js.Create(ctx, store.Job{Kind: "stack.apply", Target: "stack/s1", Owner: "alice"})
		js.Start(ctx, failed, "r")
		if err := js.Finish(ctx, failed, fmt.Errorf("terraform apply: %w", errors.New("boom")), store.Doc{}); err != nil {
			t.Fatal(err)
		}
		if j, _ := js.Get(ctx, failed); j.Status != store.JobFailed || j.Error != "terraform apply: boom" {
			t.Fatalf("failed job: %+v", j)
		}

		queued, _ := js.Create(ctx, store.Job{Kind: "stack.apply", Target: "stack/s2", Owner: "alice"})
		if j, err := js.RequestCancel(ctx, queued); err != nil || j.Status != store.JobCancelled {
			t.Fatalf("cancel queued: %+v %v", j, err)
		}

		running, _ := js.Create(ctx, store.Job{Kind: "stack.apply", Target: "stack/s2", Owner: "bob"})
		js.Start(ctx, running, "r")
		if j, err := js.RequestCancel(ctx, running); err != nil || j.Status != store.JobRunning || !j.CancelRequested {
			t.Fatalf("cancel running: %+v %v", j, err)
		}
		if err := js.Finish(ctx, running, context.Canceled, store.Doc{}); err != nil {
			t.Fatal(err)
		}
		if j, _ := js.Get(ctx, running); j.Status != store.JobCancelled {
			t.Fatalf("cancelled job: %+v", j)
		}
		if _, err := js.RequestCancel(ctx, running); !errors.Is(err, store.ErrState) {
			t.Fatalf("cancel finished: %v", err)
		}

		list, err := js.List(ctx, store.JobFilter{Target: "stack/s2"})
		if err != nil || len(list) != 2 || list[0].ID != running || list[1].ID != queued {
			t.Fatalf("list by target: %v %v", list, err)
		}
		list, err = js.List(ctx, store.JobFilter{Owner: "alice", Status: []store.JobStatus{store.JobFailed}})
		if err != nil || len(list) != 1 || list[0].ID != failed {
			t.Fatalf("list by owner and status: %v %v", list, err)
		}
		if n, err := js.Prune(ctx, store.JobPrune{Before: s.Now().Add(time.Hour)}); err != nil || n != 3 {
			t.Fatalf("prune: %d %v", n, err)
		}
	})
}

func TestJobLogBounded(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, b backend) {
		ctx := ctxT(t)
		s := b.open(t, store.Options{JobLogLines: 5})
		js := s.Jobs()
		id, _ := js.Create(ctx, store.Job{Kind: "k", Target: "stack/s"})
		js.Start(ctx, id, "r")
		for i := range 12 {
			if err := js.Log(ctx, id, fmt.Sprintf("l%d", i+1)); err != nil {
				t.Fatal(err)
			}
		}
		j, _ := js.Get(ctx, id)
		if j.LogSeq != 12 || !slices.Equal(j.Log, []string{"l8", "l9", "l10", "l11", "l12"}) {
			t.Fatalf("log %v seq %d", j.Log, j.LogSeq)
		}
		if got := j.LogSince(10); !slices.Equal(got, []string{"l11", "l12"}) {
			t.Fatalf("since 10: %v", got)
		}
		if got := j.LogSince(2); len(got) != 5 {
			t.Fatalf("since 2: %v", got)
		}
		if got := j.LogSince(12); len(got) != 0 {
			t.Fatalf("since 12: %v", got)
		}
		// One call with more lines than kept, and an overlong line.
		long := strings.Repeat("é", store.MaxLogLine) // 2 bytes a rune: the cut falls inside one
		var many []string
		for i := range 8 {
			many = append(many, fmt.Sprintf("m%d", i+1))
		}
		if err := js.Log(ctx, id, append(many, long)...); err != nil {
			t.Fatal(err)
		}
		j, _ = js.Get(ctx, id)
		if j.LogSeq != 21 || len(j.Log) != 5 || j.Log[3] != "m8" || len(j.Log[4]) > store.MaxLogLine || !utf8.ValidString(j.Log[4]) {
			t.Fatalf("after a big call: seq %d, %d lines, last %d bytes", j.LogSeq, len(j.Log), len(j.Log[4]))
		}
		if err := js.Log(ctx, id, "bad \xff utf-8"); err != nil {
			t.Fatal(err)
		}
		if j, _ = js.Get(ctx, id); j.Log[4] != "bad \uFFFD utf-8" {
			t.Fatalf("invalid UTF-8 line stored as %q", j.Log[4])
		}
	})
}

func TestJobOrphans(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, b backend) {
		ctx := ctxT(t)
		clk := newClock()
		s := b.open(t, store.Options{Now: clk.Now, JobLeaseTTL: 30 * time.Second})
		js := s.Jobs()

		id, _ := js.Create(ctx, store.Job{Kind: "stack.apply", Target: "stack/s1"})
		if _, err := js.Start(ctx, id, "replica-A"); err != nil {
			t.Fatal(err)
		}
		live, _ := js.Create(ctx, store.Job{Kind: "stack.apply", Target: "stack/s2"})
		js.Start(ctx, live, "replica-B")

		// While A is alive nobody else may run its job, and it is no orphan.
		if _, err := js.Start(ctx, id, "replica-B"); !errors.Is(err, store.ErrLocked) {
			t.Fatalf("start of a held job: %v", err)
		}
		clk.Advance(20 * time.Second)
		if err := js.Heartbeat(ctx, live, "replica-B"); err != nil {
			t.Fatal(err)
		}
		if o, _ := js.Orphans(ctx, clk.Now()); len(o) != 0 {
			t.Fatalf("orphans while runners live: %v", o)
		}

		// A dies (no more heartbeats); B keeps going.
		clk.Advance(20 * time.Second)
		if err := js.Progress(ctx, live, 50, "Building", "still here"); err != nil {
			t.Fatal(err)
		}
		o, err := js.Orphans(ctx, clk.Now())
		if err != nil || len(o) != 1 || o[0].ID != id || o[0].Runner != "replica-A" {
			t.Fatalf("orphans after A died: %+v %v", o, err)
		}

		// A restarted kloud resumes it.
		j, err := js.Start(ctx, id, "replica-C")
		if err != nil || j.Runner != "replica-C" || j.Attempt != 2 {
			t.Fatalf("resume: %+v %v", j, err)
		}
		if err := js.Heartbeat(ctx, id, "replica-A"); !errors.Is(err, store.ErrLeaseLost) {
			t.Fatalf("heartbeat of the dead runner: %v", err)
		}
		if o, _ := js.Orphans(ctx, clk.Now()); len(o) != 0 {
			t.Fatalf("orphans after resume: %v", o)
		}

		// A queued job whose creator died before starting it is an orphan too.
		q, _ := js.Create(ctx, store.Job{Kind: "stack.apply", Target: "stack/s3"})
		clk.Advance(31 * time.Second)
		o, _ = js.Orphans(ctx, clk.Now())
		ids := []string{}
		for _, j := range o {
			ids = append(ids, j.ID)
		}
		slices.Sort(ids)
		want := []string{id, live, q}
		slices.Sort(want)
		if !slices.Equal(ids, want) {
			t.Fatalf("orphans %v, want %v", ids, want)
		}
		if err := js.Finish(ctx, q, errors.New("interrupted: kloud restarted"), store.Doc{}); err != nil {
			t.Fatal(err)
		}
	})
}

// TestJobWatchSeesOtherProcess connects a second store to the same database, as another
// replica would, and checks that a watcher sees its changes through polling.
func TestJobWatchSeesOtherProcess(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s1, err := store.Open(ctxT(t), store.Options{DataDir: dir, Logger: testutil.Logger(t), JobPollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer closeStore(t, s1)
	s2, err := store.Open(ctxT(t), store.Options{MongoURL: store.EmbeddedURI(s1), DataDir: dir, Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer closeStore(t, s2)

	ctx := ctxT(t)
	id, _ := s1.Jobs().Create(ctx, store.Job{Kind: "k", Target: "stack/s"})
	w, err := s1.Jobs().Watch(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if j := <-w; j.Status != store.JobQueued {
		t.Fatalf("first state %v", j.Status)
	}
	if _, err := s2.Jobs().Start(ctx, id, "other"); err != nil {
		t.Fatal(err)
	}
	select {
	case j := <-w:
		if j.Status != store.JobRunning || j.Runner != "other" {
			t.Fatalf("polled state: %+v", j)
		}
	case <-time.After(time.Minute):
		t.Fatal("watcher did not see the other store's change")
	}
	if err := s2.Jobs().Finish(ctx, id, nil, store.Doc{}); err != nil {
		t.Fatal(err)
	}
	got := collect(t, w)
	if len(got) != 1 || got[0].Status != store.JobSucceeded {
		t.Fatalf("after finish: %+v", got)
	}
}

func TestJobWatchEndsWithContext(t *testing.T) {
	t.Parallel()
	s := storetestNew(t)
	ctx, cancel := context.WithCancel(ctxT(t))
	id, _ := s.Jobs().Create(ctx, store.Job{Kind: "k", Target: "stack/s"})
	w, err := s.Jobs().Watch(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	<-w
	cancel()
	collect(t, w)
}

// TestJobDocuments: a job's typed params and result are stored under their JSON names (as the
// API shows them), decode back into their types, and a job written before params were typed (a
// map, numbers as doubles, files as JSON text) decodes into the same type.
func TestJobDocuments(t *testing.T) {
	t.Parallel()
	type file struct {
		Name string `json:"name"`
	}
	type params struct {
		StackID string                            `json:"stackId"`
		Rev     int                               `json:"rev"`
		Destroy bool                              `json:"destroy"`
		Reason  string                            `json:"reason,omitempty"`
		Count   *int                              `json:"count,omitempty"`
		Files   store.JSONText[[]file]            `json:"files"`
		Vars    store.JSONText[map[string]string] `json:"variables"`
		Nested  map[string]any                    `json:"nested,omitempty"`
	}
	forEach(t, func(t *testing.T, b backend) {
		ctx := ctxT(t)
		s := b.open(t, store.Options{})
		js := s.Jobs()
		p := params{StackID: "s1", Rev: 3, Count: new(0), Files: store.JSONTextOf([]file{{"main.tf"}}),
			Vars: store.JSONTextOf(map[string]string{"a": "b"}), Nested: map[string]any{"doc": map[string]any{"x": 2.5}}}
		id, err := js.Create(ctx, store.Job{Kind: "stack.update", Target: "stack/s1", Params: mustDoc(t, p)})
		if err != nil {
			t.Fatal(err)
		}
		j, err := js.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]any{"stackId": "s1", "rev": int32(3), "destroy": false, "count": int32(0),
			"files": `[{"name":"main.tf"}]`, "variables": `{"a":"b"}`, "nested": map[string]any{"doc": map[string]any{"x": 2.5}}}
		if got := j.Params.Map(); !reflect.DeepEqual(got, want) {
			t.Fatalf("stored params\n got %#v\nwant %#v", got, want)
		}
		var back params
		if err := j.Params.Decode(&back); err != nil || !reflect.DeepEqual(back, p) {
			t.Fatalf("decoded %+v (%v), want %+v", back, err, p)
		}
		if !j.Result.IsZero() || j.Result.Map() != nil {
			t.Fatalf("a job without a result has %v", j.Result.Map())
		}
		if err := js.Finish(ctx, id, nil, mustDoc(t, struct{}{})); err != nil {
			t.Fatal(err)
		}
		if raw := storetest.Raw(t, s, store.CollJobs, id); raw.Lookup("result").Type != 0 {
			t.Fatalf("an empty result was stored: %v", raw.Lookup("result"))
		}

		// A job as the old code wrote it.
		old, err := js.Create(ctx, store.Job{Kind: "stack.update", Target: "stack/s2"})
		if err != nil {
			t.Fatal(err)
		}
		storetest.SetFields(t, s, store.CollJobs, old, map[string]any{"params": map[string]any{
			"stackId": "s2", "rev": 4.0, "destroy": true, "files": `[{"name":"a.tf"}]`, "variables": "null", "gone": "a key no type has"}})
		if j, err = js.Get(ctx, old); err != nil {
			t.Fatal(err)
		}
		back = params{}
		if err := j.Params.Decode(&back); err != nil || back.StackID != "s2" || back.Rev != 4 || !back.Destroy ||
			!reflect.DeepEqual(back.Files.V, []file{{"a.tf"}}) || back.Vars.V != nil {
			t.Fatalf("old params decoded as %+v (%v)", back, err)
		}
		// A field of the wrong type is an error, not a zero value.
		storetest.SetFields(t, s, store.CollJobs, old, map[string]any{"params.destroy": "yes"})
		if j, err = js.Get(ctx, old); err != nil {
			t.Fatal(err)
		}
		if err := j.Params.Decode(&back); err == nil {
			t.Fatalf("destroy \"yes\" decoded as %+v", back)
		}
	})
}
