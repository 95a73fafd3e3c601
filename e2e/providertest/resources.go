package providertest

import (
	"testing"

	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/provider"
)

// testResources (capability "resources"): the provider lists a resource for each of the stack's
// machines, with kloud's tags (stack, team, owner, machine, instance) and the id Terraform's
// state has for it; kloud's gc.run (grace none) finds none of them to be garbage.
func (s *suite) testResources(t *testing.T) {
	s.needCap(t, provider.CapResources)
	s.needStack(t)
	if s.p.Inventory == nil {
		t.Fatalf("provider %s advertises %q but has no Inventory", s.p.Name, provider.CapResources)
	}
	rs, err := s.p.Inventory.Resources(t.Context())
	if err != nil {
		t.Fatalf("Resources: %v", err)
	}
	instance := ""
	for _, m := range s.machines {
		var found []provider.Resource
		for _, r := range rs {
			if r.Tag(provider.TagStack) == s.stackID && r.Tag(provider.TagMachine) == m.ID {
				found = append(found, r)
			}
		}
		if len(found) != 1 {
			t.Errorf("machine %s: %d resources tagged with its stack and machine, want 1 (all: %+v)", m.Label, len(found), rs)
			continue
		}
		r := found[0]
		t.Logf("machine %s: %s, tags %v", m.Label, r, r.Tags)
		for k, want := range map[string]string{provider.TagOwner: user, provider.TagTeam: team} {
			if r.Tag(k) != want {
				t.Errorf("machine %s: tag %s = %q, want %q", m.Label, k, r.Tag(k), want)
			}
		}
		if id, _ := m.Attributes["id"].(string); r.ID != id {
			t.Errorf("machine %s: resource id %q, Terraform's state has %q", m.Label, r.ID, id)
		}
		if r.Tag(provider.TagInstance) == "" || instance != "" && r.Tag(provider.TagInstance) != instance {
			t.Errorf("machine %s: tag %s = %q (the others': %q)", m.Label, provider.TagInstance, r.Tag(provider.TagInstance), instance)
		}
		instance = r.Tag(provider.TagInstance)
		if r.Incomplete {
			t.Errorf("machine %s: listed as incomplete", m.Label)
		}
	}
	res, err := s.env.Client(kloud.Admin).GCRun(t.Context(), api.GCRunParams{DryRun: true, Provider: s.p.Name})
	if err != nil {
		t.Fatalf("gc.run: %v", err)
	}
	for _, g := range res.Garbage {
		if g.Resource.Tag(provider.TagStack) == s.stackID {
			t.Errorf("gc.run calls a resource of the live stack garbage: %+v", g)
		}
	}
	if _, err := s.cl.GCRun(t.Context(), api.GCRunParams{DryRun: true}); err == nil {
		t.Errorf("gc.run by a user who is no kloud administrator: no error")
	}
	s.resStack = s.stackID
}

// testResourcesGone: after the stack's destroy, the provider lists nothing of it.
func (s *suite) testResourcesGone(t *testing.T) {
	s.needCap(t, provider.CapResources)
	if s.resStack == "" {
		t.Skip("needs Resources to have seen the stack")
	}
	rs, err := s.p.Inventory.Resources(t.Context())
	if err != nil {
		t.Fatalf("Resources: %v", err)
	}
	for _, r := range rs {
		if r.Tag(provider.TagStack) == s.resStack {
			t.Errorf("after destroy the provider still lists %s of stack %s", r, s.resStack)
		}
	}
}
