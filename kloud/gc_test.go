package kloud_test

import (
	"errors"
	"testing"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/provider"
)

// TestGCRunRefusals: gc.run is for kloud administrators, names a provider that exists and lists
// its resources, and with nothing to collect says so. (The collection itself is tested with real
// machines: e2e TestLocalGC, and each provider's conformance case Resources.)
func TestGCRunRefusals(t *testing.T) {
	t.Parallel()
	reg := provider.NewRegistry()
	reg.Register(&provider.Provider{Name: "plain", ResourceType: "plain_machine"})
	e := kloudtest.Start(t, kloudtest.Options{Providers: reg})
	admin := e.Client(kloud.Admin)
	ctx := t.Context()
	if _, err := admin.UserAdd(ctx, api.UserAddParams{Username: "bob", Team: model.DefaultTeam}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		who  string
		p    api.GCRunParams
		want error
	}{
		{"bob", api.GCRunParams{DryRun: true}, kite.ErrPermission},
		{kloud.Admin, api.GCRunParams{Provider: "nosuch"}, kite.ErrNotFound},
		{kloud.Admin, api.GCRunParams{Provider: "plain"}, kite.ErrState}, // -32005: no "resources"
		{kloud.Admin, api.GCRunParams{Provider: "Bad Name"}, kite.ErrInvalidParams},
	} {
		_, err := e.Client(c.who).GCRun(ctx, c.p)
		if !errors.Is(err, c.want) {
			t.Errorf("gc.run %+v as %s: %v, want %v", c.p, c.who, err, c.want)
		}
	}
	res, err := admin.GCRun(ctx, api.GCRunParams{})
	if err != nil || len(res.Garbage) != 0 || len(res.Providers) != 0 || res.DryRun {
		t.Errorf("gc.run with no provider that lists resources: %+v %v", res, err)
	}
}
