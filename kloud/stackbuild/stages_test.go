package stackbuild_test

import (
	"reflect"
	"testing"

	"github.com/kloud-dev/kloud/kloud/stackbuild"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/provider"
)

// Each flow's stages advance, end at 100% in the flow's final state, and a stage's span
// (Within) stays between its start and the next stage.
func TestStagesAdvance(t *testing.T) {
	flows := map[string]struct {
		stages []stackbuild.Stage
		final  provider.State
	}{
		"build":   {[]stackbuild.Stage{stackbuild.BuildChecking, stackbuild.BuildCredentials, stackbuild.BuildUserData, stackbuild.BuildBuckets, stackbuild.BuildResources, stackbuild.BuildAgents, stackbuild.BuildSettings, stackbuild.BuildDone}, provider.Running},
		"destroy": {[]stackbuild.Stage{stackbuild.DestroyMachines, stackbuild.DestroyResources, stackbuild.DestroyKeys, stackbuild.DestroyBuckets, stackbuild.DestroyDone}, provider.Terminated},
		"start":   {[]stackbuild.Stage{stackbuild.MachineStarting, stackbuild.MachineAgent, stackbuild.MachineStarted}, provider.Running},
		"stop":    {[]stackbuild.Stage{stackbuild.MachineStopping, stackbuild.MachineStopped}, provider.Stopped},
	}
	for name, f := range flows {
		prev := 0
		for i, st := range f.stages {
			p := st.Percent()
			if p <= prev {
				t.Errorf("%s: %q at %d%%, not after %d%%", name, st, p, prev)
			}
			if i < len(f.stages)-1 {
				next := f.stages[i+1].Percent()
				if st.Within(0) != p || st.Within(100) > next || st.Within(50) < p || st.Within(150) > next {
					t.Errorf("%s: %q spans %d..%d, want within %d..%d", name, st, st.Within(0), st.Within(100), p, next)
				}
				if st.State() == f.final && f.final != provider.Running {
					t.Errorf("%s: %q already names the final state %s", name, st, f.final)
				}
			}
			prev = p
		}
		last := f.stages[len(f.stages)-1]
		if last.Percent() != 100 || last.State() != f.final {
			t.Errorf("%s: ends with %q at %d%% in %s, want 100%% in %s", name, last, last.Percent(), last.State(), f.final)
		}
	}
	if stackbuild.BuildResources.Within(100) != stackbuild.BuildAgents.Percent() {
		t.Errorf("terraform's apply ends at %d%%, want %d%%", stackbuild.BuildResources.Within(100), stackbuild.BuildAgents.Percent())
	}
}

// TestApplyParamsDocument: a stack.apply job's params are stored under the names job.get has
// always shown, decode back, and a document stack.apply did not make is refused.
func TestApplyParamsDocument(t *testing.T) {
	p := stackbuild.ApplyParams{StackID: "s1", Destroy: true, Lease: "apply-1"}
	d, err := store.EncodeDoc(p)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := d.Map(), map[string]any{"stackId": "s1", "destroy": true, "lease": "apply-1"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("document %v, want %v", got, want)
	}
	var got stackbuild.ApplyParams
	if err := d.Decode(&got); err != nil || got != p || got.Validate() != nil {
		t.Fatalf("round trip: %+v, %v, %v", got, err, got.Validate())
	}
	for _, bad := range []map[string]any{{}, {"stackId": "s1"}, {"stackId": "s1", "lease": "l", "destroy": "yes"}} {
		d, err := store.EncodeDoc(bad)
		if err != nil {
			t.Fatal(err)
		}
		var p stackbuild.ApplyParams
		if err := d.Decode(&p); err == nil && p.Validate() == nil {
			t.Errorf("%v: no error", bad)
		}
	}
}
