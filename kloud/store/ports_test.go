package store_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/provider"
)

// TestMachinePorts: AddPorts adds each rule once (whole values compared), RemovePorts removes
// exactly the rules given (not another rule of the same port), both of a missing machine are
// ErrNotFound, and an empty list changes nothing.
func TestMachinePorts(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, b backend) {
		ctx := ctxT(t)
		s := b.open(t, store.Options{})
		now := s.Now()
		if err := s.Machines().InsertMany(ctx, []model.Machine{{ID: "m1", StackID: "s1", Label: "a", Owner: "alice", State: "Running", CreatedAt: now, UpdatedAt: now}}); err != nil {
			t.Fatal(err)
		}
		ports := func() []provider.PortRule {
			t.Helper()
			m, err := s.Machines().Get(ctx, "m1")
			if err != nil {
				t.Fatal(err)
			}
			return m.Ports
		}
		web := provider.PortRule{Port: 80, Protocol: "tcp", From: "any"}
		webTeam := provider.PortRule{Port: 80, Protocol: "tcp", From: "team"}
		dns := provider.PortRule{Port: 53, Protocol: "udp", From: "10.0.0.0/8"}
		if err := s.Machines().AddPorts(ctx, "m1", []provider.PortRule{web, webTeam}); err != nil {
			t.Fatal(err)
		}
		if err := s.Machines().AddPorts(ctx, "m1", []provider.PortRule{dns, web}); err != nil {
			t.Fatal(err)
		}
		if got := ports(); !slices.Equal(got, []provider.PortRule{web, webTeam, dns}) {
			t.Fatalf("after adding: %+v", got)
		}
		if err := s.Machines().RemovePorts(ctx, "m1", []provider.PortRule{web, {Port: 9, Protocol: "tcp", From: "any"}}); err != nil {
			t.Fatal(err)
		}
		if got := ports(); !slices.Equal(got, []provider.PortRule{webTeam, dns}) {
			t.Fatalf("after removing 80 from any: %+v", got)
		}
		if err := s.Machines().AddPorts(ctx, "m1", nil); err != nil {
			t.Fatal(err)
		}
		if err := s.Machines().RemovePorts(ctx, "m1", nil); err != nil {
			t.Fatal(err)
		}
		if got := ports(); !slices.Equal(got, []provider.PortRule{webTeam, dns}) {
			t.Fatalf("after empty changes: %+v", got)
		}
		for _, err := range []error{
			s.Machines().AddPorts(ctx, "nope", []provider.PortRule{web}),
			s.Machines().RemovePorts(ctx, "nope", []provider.PortRule{web}),
		} {
			if !errors.Is(err, store.ErrNotFound) {
				t.Errorf("ports of a missing machine: %v, want ErrNotFound", err)
			}
		}
	})
}
