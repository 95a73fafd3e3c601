package kloud

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/kloud/store"
)

// TestAPIJobWire: a job as the API returns it (api.Job) has exactly the JSON of the store's job
// document, every field set.
func TestAPIJobWire(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	j := store.Job{ID: "j", Kind: "stack.apply", Target: "stack/s", Owner: "alice", Params: map[string]any{"stackId": "s"},
		Status: store.JobFailed, Percent: 40, Stage: "Building", Message: "m", Error: "e", Result: map[string]any{"x": 1.0},
		Log: []string{"a", "b"}, LogSeq: 7, Runner: "r", LeaseUntil: now, Attempt: 2, CancelRequested: true,
		Rev: 9, CreatedAt: now, UpdatedAt: now, StartedAt: now, FinishedAt: now}
	var want, got map[string]any
	b, _ := json.Marshal(j)
	json.Unmarshal(b, &want)
	b, _ = json.Marshal(apiJob(j))
	json.Unmarshal(b, &got)
	if !reflect.DeepEqual(want, got) {
		t.Fatalf("api.Job JSON differs from store.Job's:\nstore: %v\napi:   %v", want, got)
	}
	if n := reflect.TypeFor[store.Job]().NumField(); len(want) != n {
		t.Fatalf("the test sets %d of store.Job's %d fields", len(want), n)
	}
}
