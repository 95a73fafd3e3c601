package kloud

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/snapshots"
	"github.com/kloud-dev/kloud/kloud/stackbuild"
	"github.com/kloud-dev/kloud/kloud/store"
)

// TestAPIJobWire: a job as the API returns it (api.Job) has exactly the JSON of the store's job
// document, every field set.
func TestAPIJobWire(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	params, err := store.EncodeDoc(stackbuild.ApplyParams{StackID: "s", Lease: "l"})
	if err != nil {
		t.Fatal(err)
	}
	result, err := store.EncodeDoc(stackbuild.StackResult{StackID: "s", Machines: new(0)})
	if err != nil {
		t.Fatal(err)
	}
	j := store.Job{ID: "j", Kind: "stack.apply", Target: "stack/s", Owner: "alice", Params: params,
		Status: store.JobFailed, Percent: 40, Stage: "Building", Message: "m", Error: "e", Result: result,
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
	if p := want["params"]; !reflect.DeepEqual(p, map[string]any{"stackId": "s", "destroy": false, "lease": "l"}) {
		t.Fatalf("params on the wire: %v", p)
	}
	if r := want["result"]; !reflect.DeepEqual(r, map[string]any{"stackId": "s", "machines": 0.0}) {
		t.Fatalf("result on the wire: %v", r)
	}
	if n := reflect.TypeFor[store.Job]().NumField(); len(want) != n {
		t.Fatalf("the test sets %d of store.Job's %d fields", len(want), n)
	}
}

// TestJobDocumentsWire: each kind's typed params and result show on the API (job.get, job.watch)
// as the maps kloud stored before they were typed: the same keys, values and JSON.
func TestJobDocumentsWire(t *testing.T) {
	t.Parallel()
	idx := 1
	plan := api.StackPlanResult{TemplateID: "t", Rev: 2, Machines: []api.PlannedMachine{
		{Label: "vm", Provider: "local", Resource: "kloudlocal_machine.vm", Index: &idx, Attributes: map[string]any{"memory": 512.0, "tags": map[string]any{"a": "b"}, "dns": []any{"1.1.1.1"}, "x": nil}},
		{Label: "db", Provider: "local", Resource: "kloudlocal_machine.db"}},
		Update: &api.StackUpdatePlan{StackID: "s", FromRev: 1, ToRev: 2, Summary: map[string]int{"keep": 1},
			Machines: []api.MachineChange{{Label: "vm", Action: "change", Changes: []api.AttrChange{{Name: "memory", Before: 256.0, After: 512.0}, {Name: "flag", Before: false}}}}}}
	files := []model.File{{Name: "main.tf", Content: "resource {}"}}
	for _, tc := range []struct {
		name string
		v    any
		old  map[string]any // what the code before typed params stored
	}{
		{"stack.apply params", stackbuild.ApplyParams{StackID: "s", Lease: "apply-1"}, map[string]any{"stackId": "s", "destroy": false, "lease": "apply-1"}},
		{"stack.apply result", stackbuild.StackResult{StackID: "s", Machines: new(0)}, map[string]any{"stackId": "s", "machines": 0}},
		{"stack.apply failed", stackbuild.StackResult{StackID: "s"}, map[string]any{"stackId": "s"}},
		{"stack.apply destroyed", stackbuild.StackResult{StackID: "s", Destroyed: true}, map[string]any{"stackId": "s", "destroyed": true}},
		{"stack.update result", stackbuild.StackResult{StackID: "s", Machines: new(2), Awaited: new(0)}, map[string]any{"stackId": "s", "machines": 2, "awaited": 0}},
		{"stack.update params", updateParams{StackID: "s", Lease: "update-1", From: model.StackFailed, Rev: 3, Diverged: true,
			Files: store.JSONTextOf(files), Variables: store.JSONTextOf(map[string]string{"v": "1"}), What: "scaling"},
			map[string]any{"stackId": "s", "lease": "update-1", "from": model.StackFailed, "rev": 3, "diverged": true,
				"files": `[{"name":"main.tf","content":"resource {}"}]`, "variables": `{"v":"1"}`, "what": "scaling"}},
		{"stack.update params without variables", updateParams{StackID: "s", Lease: "l", Files: store.JSONTextOf(files)},
			map[string]any{"stackId": "s", "lease": "l", "from": "", "rev": 0, "diverged": false,
				"files": `[{"name":"main.tf","content":"resource {}"}]`, "variables": "null", "what": ""}},
		{"machine.stop params", powerParams{MachineID: "m", Lease: "stop-1", From: "Running"}, map[string]any{"machineId": "m", "lease": "stop-1", "from": "Running"}},
		{"machine.stop params (idle)", powerParams{MachineID: "m", Lease: "stop-1", From: "Running", Reason: "idle for 4s", IdleDeadline: "2026-01-02T03:04:05Z", IdleTimeout: "4s"},
			map[string]any{"machineId": "m", "lease": "stop-1", "from": "Running", "reason": "idle for 4s", "idleDeadline": "2026-01-02T03:04:05Z", "idleTimeout": "4s"}},
		{"machine.start result", machineResult{MachineID: "m", State: "Running"}, map[string]any{"machineId": "m", "state": "Running"}},
		{"machine.snapshot params", snapshots.Params{MachineID: "m", SnapshotID: "sn", Lease: "l", From: "Stopped"}, map[string]any{"machineId": "m", "snapshotId": "sn", "lease": "l", "from": "Stopped"}},
		{"machine.snapshot result", snapshots.SnapshotResult{MachineID: "m", State: "Running", SnapshotID: "sn", Size: 1 << 40}, map[string]any{"machineId": "m", "state": "Running", "snapshotId": "sn", "size": int64(1 << 40)}},
		{"machine.restore result", snapshots.RestoreResult{MachineID: "m", State: "Stopped", SnapshotID: "sn"}, map[string]any{"machineId": "m", "state": "Stopped", "snapshotId": "sn"}},
		{"credential.bootstrap params", bootstrapParams{Credential: "c"}, map[string]any{"credential": "c", "destroy": false}},
		{"credential.bootstrap result", bootstrapResult{Credential: "c", Outputs: &[]string{"a", "b"}}, map[string]any{"credential": "c", "outputs": []string{"a", "b"}}},
		{"credential.bootstrap no outputs", bootstrapResult{Credential: "c", Outputs: new([]string(nil))}, map[string]any{"credential": "c", "outputs": []string(nil)}},
		{"credential.bootstrap destroyed", bootstrapResult{Credential: "c", Destroyed: &[]string{"x"}}, map[string]any{"credential": "c", "destroyed": []string{"x"}}},
		{"stack.plan params", planJobParams{Plan: api.StackPlanParams{TemplateID: "t", Rev: 2, Variables: map[string]string{"a": "b"}}, Admin: true}, jsonMap(t, planJobParams{Plan: api.StackPlanParams{TemplateID: "t", Rev: 2, Variables: map[string]string{"a": "b"}}, Admin: true})},
		{"stack.plan result", plan, jsonMap(t, plan)},
		{"stack.plan result, no machines", api.StackPlanResult{TemplateID: "t"}, jsonMap(t, api.StackPlanResult{TemplateID: "t"})},
	} {
		d, err := store.EncodeDoc(tc.v)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got, _ := json.Marshal(d.Map())
		want, _ := json.Marshal(tc.old)
		if string(got) != string(want) {
			t.Errorf("%s on the wire\n got %s\nwant %s", tc.name, got, want)
		}
		// Params decode back (kloud never reads a result).
		if !strings.Contains(tc.name, "params") {
			continue
		}
		back := reflect.New(reflect.TypeOf(tc.v))
		if err := d.Decode(back.Interface()); err != nil {
			t.Errorf("%s: decode: %v", tc.name, err)
		} else if again, _ := store.EncodeDoc(back.Elem().Interface()); !reflect.DeepEqual(again.Map(), d.Map()) {
			t.Errorf("%s: decoded as %+v", tc.name, back.Elem().Interface())
		}
	}
}

// jsonMap is v as a JSON object: how the plan job stored its params and result before they
// were typed.
func jsonMap(t *testing.T, v any) map[string]any {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestJobKindRunDoc: a kind decodes and checks its params before running, fails a recovered job
// it cannot resume, and stores the result it returns (also beside an error), none when zero.
func TestJobKindRunDoc(t *testing.T) {
	t.Parallel()
	var got []stackbuild.ApplyParams
	k := jobKind[stackbuild.ApplyParams, stackbuild.StackResult]{name: jobStackApply,
		run: func(_ context.Context, _ *jobCtx, p stackbuild.ApplyParams) (stackbuild.StackResult, error) {
			got = append(got, p)
			if p.Destroy {
				return stackbuild.StackResult{StackID: p.StackID}, errors.New("machines failed")
			}
			return stackbuild.StackResult{}, nil
		}}
	job := func(params map[string]any) *jobCtx {
		d, err := store.EncodeDoc(params)
		if err != nil {
			t.Fatal(err)
		}
		return &jobCtx{Job: store.Job{ID: "j", Kind: jobStackApply, Params: d}}
	}
	ctx := t.Context()
	// A document stack.apply did not make: refused before running.
	for _, bad := range []map[string]any{{"lease": "l"}, {"stackId": "s"}, {"stackId": "s", "lease": "l", "destroy": "yes"}} {
		if _, err := k.runDoc(ctx, job(bad), false); err == nil {
			t.Errorf("%v: ran", bad)
		}
	}
	if len(got) != 0 {
		t.Fatalf("ran with %+v", got)
	}
	// An old job (a map without destroy) runs; a zero result is none.
	res, err := k.runDoc(ctx, job(map[string]any{"stackId": "s", "lease": "l"}), false)
	if err != nil || !res.IsZero() || len(got) != 1 || got[0] != (stackbuild.ApplyParams{StackID: "s", Lease: "l"}) {
		t.Fatalf("run: %v %v %+v", res.Map(), err, got)
	}
	// A result beside an error is kept.
	res, err = k.runDoc(ctx, job(map[string]any{"stackId": "s", "lease": "l", "destroy": true}), false)
	if err == nil || !reflect.DeepEqual(res.Map(), map[string]any{"stackId": "s"}) {
		t.Fatalf("failed run: %v %v", res.Map(), err)
	}
	// No recover: a recovered job fails with the reason, without running.
	if _, err := k.runDoc(ctx, job(map[string]any{"stackId": "s", "lease": "l"}), true); err == nil || !strings.Contains(err.Error(), "run it again") || len(got) != 2 {
		t.Fatalf("recovered: %v (runs %d)", err, len(got))
	}
}
