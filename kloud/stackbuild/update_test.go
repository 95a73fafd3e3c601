package stackbuild

import (
	"errors"
	"slices"
	"testing"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/provider"
)

// TestMatchMachines: an update's machines by label: a record the new files still declare is
// kept (with the planned attributes in its spec), a new label is a new Building record of the
// stack's owner, a label gone is removed, and a provider left with no machine is vacated (it
// still configures itself so terraform can destroy them). A machine in a transition, or one
// that would change provider, is refused, saying which.
func TestMatchMachines(t *testing.T) {
	t.Parallel()
	st := &model.Stack{ID: "s1", Owner: "alice", Team: "t"}
	ms := []model.Machine{
		{ID: "m-web", Label: "web", Resource: "web", Provider: "local", KiteID: "k-web", State: provider.Running},
		{ID: "m-db", Label: "db", Resource: "db", Provider: "docker", KiteID: "k-db", State: provider.Stopped},
	}
	planned := []api.PlannedMachine{
		{Label: "web", Resource: "web", Provider: "local", Attributes: map[string]any{"memory": 640.0, "user_data": "script"}},
		{Label: "app.0", Resource: "app", Provider: "local", Attributes: map[string]any{"memory": 256.0, "user_data": "x"}},
	}
	mt, err := matchMachines(st, planned, ms)
	if err != nil {
		t.Fatal(err)
	}
	if len(mt.kept) != 1 || mt.kept[0].ID != "m-web" {
		t.Errorf("kept %+v, want web", mt.kept)
	}
	if len(mt.added) != 1 {
		t.Fatalf("added %+v, want app.0", mt.added)
	}
	a := mt.added[0]
	if a.Label != "app.0" || a.StackID != "s1" || a.Owner != "alice" || a.Team != "t" || a.State != provider.Building ||
		a.Agent.Status != model.AgentNever || a.ID == "" || a.KiteID != "" {
		t.Errorf("added record %+v", a)
	}
	if _, hidden := a.Attributes["user_data"]; hidden || a.Attributes["memory"] != 256.0 {
		t.Errorf("added record's attributes %v: want memory, never user data", a.Attributes)
	}
	if len(mt.removed) != 1 || mt.removed[0].ID != "m-db" {
		t.Errorf("removed %+v, want db", mt.removed)
	}
	if !slices.Equal(mt.vacated, []string{"docker"}) {
		t.Errorf("vacated %v, want docker", mt.vacated)
	}
	if len(mt.specs) != 2 || mt.specs[0].ID != "m-web" || mt.specs[0].KiteID != "k-web" || mt.specs[0].Attributes["user_data"] != "script" || mt.specs[1].ID != a.ID {
		t.Errorf("specs %+v: want web's (its kite id, the planned attributes) and app.0's", mt.specs)
	}

	busy := slices.Clone(ms)
	busy[1].State = provider.Stopping
	if _, err := matchMachines(st, planned, busy); !errors.Is(err, kite.ErrState) {
		t.Errorf("a machine in a transition: %v, want ErrState", err)
	}
	moved := slices.Clone(planned)
	moved[0].Provider = "docker"
	if _, err := matchMachines(st, moved, ms); !errors.Is(err, kite.ErrInvalidParams) {
		t.Errorf("a machine changing provider: %v, want ErrInvalidParams", err)
	}
}
