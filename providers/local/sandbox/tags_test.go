package sandbox_test

import (
	"errors"
	"maps"
	"testing"

	"github.com/kloud-dev/kloud/providers/local/sandbox"
)

// SetTags changes a machine's tags on disk, running or stopped, and nothing else.
func TestSetTags(t *testing.T) {
	e := newEnv(t)
	id := "tags-" + randHex(t, 6)
	info := e.create(t, sandbox.Spec{ID: id, Tags: map[string]string{"kloud_stack": "s1", "keep": "x"}})
	want := map[string]string{"kloud_stack": "s2", "kloud_machine": "m1"}
	got, err := e.m.SetTags(t.Context(), id, want)
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(got.Tags, want) || got.State != sandbox.StateRunning || got.PID != info.PID {
		t.Fatalf("after SetTags: %+v", got)
	}
	if _, err := e.m.Stop(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.SetTags(t.Context(), id, nil); err != nil {
		t.Fatal(err)
	}
	got, err = e.m.Info(t.Context(), id)
	if err != nil || got.Tags != nil || got.State != sandbox.StateStopped || got.IP != info.IP {
		t.Fatalf("stopped machine after SetTags(nil): %+v, %v", got, err)
	}
	if _, err := e.m.SetTags(t.Context(), "no-such-machine", want); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("SetTags of a missing machine: %v, want ErrNotFound", err)
	}
}
