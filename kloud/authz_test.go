package kloud_test

import (
	"errors"
	"testing"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/providers/dummy"
)

// TestStackAuthz is the authorization table for templates, stacks, machines and jobs: alice owns
// them; carol is in alice's team (red) as a member; bob is in another team (blue); admin is the
// kloud administrator. Nobody sees or touches another user's stacks and machines, team members
// share templates but may not change another member's, and what one may not see is "not found".
func TestStackAuthz(t *testing.T) {
	t.Parallel()
	f := newFlow(t, dummy.Options{})
	admin := f.Dial(kloud.Admin)
	kloudtest.Call(t, admin, "team.create", map[string]string{"slug": "red", "title": "Red"}, nil)
	kloudtest.Call(t, admin, "team.create", map[string]string{"slug": "blue", "title": "Blue"}, nil)
	kloudtest.Call(t, admin, "user.add", map[string]string{"username": "carol", "team": "red"}, nil)
	kloudtest.Call(t, admin, "user.add", map[string]string{"username": "bob", "team": "blue"}, nil)
	kloudtest.Call(t, admin, "team.addMember", map[string]string{"team": "red", "username": "alice", "role": "member"}, nil)
	kloudtest.Call(t, admin, "team.removeMember", map[string]string{"team": kloud.DefaultTeam, "username": "alice"}, nil)
	alice := f.Dial("alice")
	f.alice = alice
	kloudtest.Call(t, alice, "credential.add", map[string]any{"provider": "dummy", "title": "red cred", "team": "red", "data": map[string]string{"token": "red-token"}}, nil)
	bob, carol := f.Dial("bob"), f.Dial("carol")
	kloudtest.Call(t, bob, "credential.add", map[string]any{"provider": "dummy", "title": "blue cred", "data": map[string]string{"token": "blue-token"}}, nil)

	var tpl struct{ ID string }
	kloudtest.Call(t, alice, "template.create", map[string]any{"title": "t", "team": "red", "files": map[string]string{"main.tf": twoVMs}}, &tpl)
	var created struct {
		Stack    kloud.Stack
		Machines []kloud.Machine
	}
	kloudtest.Call(t, alice, "stack.create", map[string]any{"templateId": tpl.ID}, &created)
	sid, mid := created.Stack.ID, created.Machines[0].ID
	var jobs struct {
		Jobs []struct{ ID string }
	}

	is := func(target error) func(error) bool { return func(err error) bool { return errors.Is(err, target) } }
	none := func(err error) bool { return err == nil }
	type row struct {
		method string
		params any
		want   map[string]func(error) bool
	}
	users := map[string]*kite.Conn{"alice": alice, "carol": carol, "bob": bob, "admin": admin}
	rows := []row{
		{"template.get", map[string]string{"id": tpl.ID}, map[string]func(error) bool{"alice": none, "carol": none, "bob": is(kite.ErrNotFound), "admin": none}},
		{"template.update", map[string]string{"id": tpl.ID, "title": "renamed"}, map[string]func(error) bool{"alice": none, "carol": is(kite.ErrPermission), "bob": is(kite.ErrNotFound), "admin": none}},
		{"template.delete", map[string]string{"id": tpl.ID}, map[string]func(error) bool{"carol": is(kite.ErrPermission), "bob": is(kite.ErrNotFound)}},
		{"stack.plan", map[string]string{"templateId": tpl.ID}, map[string]func(error) bool{"alice": none, "carol": none, "bob": is(kite.ErrNotFound)}},
		{"stack.create", map[string]string{"templateId": tpl.ID}, map[string]func(error) bool{"bob": is(kite.ErrNotFound)}},
		{"stack.describe", map[string]string{"id": sid}, map[string]func(error) bool{"alice": none, "carol": is(kite.ErrNotFound), "bob": is(kite.ErrNotFound), "admin": none}},
		{"stack.apply", map[string]any{"stackId": sid, "destroy": true}, map[string]func(error) bool{"carol": is(kite.ErrNotFound), "bob": is(kite.ErrNotFound)}},
		{"machine.info", map[string]string{"machineId": mid}, map[string]func(error) bool{"alice": none, "carol": is(kite.ErrNotFound), "bob": is(kite.ErrNotFound), "admin": none}},
		{"machine.start", map[string]string{"machineId": mid}, map[string]func(error) bool{"alice": is(kite.ErrState), "carol": is(kite.ErrNotFound), "bob": is(kite.ErrNotFound)}},
		{"machine.stop", map[string]string{"machineId": mid}, map[string]func(error) bool{"alice": is(kite.ErrState), "carol": is(kite.ErrNotFound), "bob": is(kite.ErrNotFound), "admin": is(kite.ErrState)}},
	}
	for _, r := range rows {
		for who, want := range r.want {
			err := users[who].Call(t.Context(), r.method, r.params, nil)
			if !want(err) {
				t.Errorf("%s as %s: got %v", r.method, who, err)
			}
		}
	}
	// Lists show only one's own.
	for who, c := range map[string]*kite.Conn{"carol": carol, "bob": bob} {
		var ms struct{ Machines []kloud.Machine }
		kloudtest.Call(t, c, "machine.list", nil, &ms)
		var ss struct{ Stacks []kloud.Stack }
		kloudtest.Call(t, c, "stack.list", nil, &ss)
		for _, s := range ss.Stacks {
			if s.Owner == "alice" {
				t.Errorf("%s lists alice's stack", who)
			}
		}
		for _, m := range ms.Machines {
			if m.Owner == "alice" {
				t.Errorf("%s lists alice's machine", who)
			}
		}
		var tl struct{ Templates []api.TemplateSummary }
		kloudtest.Call(t, c, "template.list", nil, &tl)
		if who == "bob" && len(tl.Templates) != 0 {
			t.Errorf("bob lists red's templates: %+v", tl.Templates)
		}
	}
	if err := bob.Call(t.Context(), "stack.list", map[string]any{"all": true, "team": "red"}, nil); !errors.Is(err, kite.ErrPermission) {
		t.Errorf("bob listing red's stacks: %v", err)
	}
	// A job of alice's: destroying her (never built) stack.
	var job struct{ JobID string }
	kloudtest.Call(t, alice, "stack.apply", map[string]any{"stackId": sid, "destroy": true}, &job)
	f.follow(job.JobID)
	kloudtest.Call(t, alice, "job.list", nil, &jobs)
	if len(jobs.Jobs) == 0 {
		t.Fatal("alice has no jobs")
	}
	for _, j := range jobs.Jobs {
		for who, c := range map[string]*kite.Conn{"carol": carol, "bob": bob} {
			if err := c.Call(t.Context(), "job.get", map[string]string{"jobId": j.ID}, nil); !errors.Is(err, kite.ErrNotFound) {
				t.Errorf("job.get of alice's job as %s: %v", who, err)
			}
		}
	}
}
