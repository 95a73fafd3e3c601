package kloud_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/providers/dummy"
)

// TestStackAuthz is the authorization table for templates, stacks, machines and jobs: alice owns
// them; carol is in alice's team (red) as a member; bob is in another team (blue); admin is the
// kloud administrator. Nobody sees or touches another user's stacks and machines, team members
// share templates but may not change another member's, and what one may not see is "not found".
func TestStackAuthz(t *testing.T) {
	t.Parallel()
	f := newFlow(t, dummy.Options{})
	ctx := t.Context()
	admin := f.Dial(kloud.Admin)
	ac := api.NewClient(admin)
	ok := func(err error, what string) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	ok(errOf(ac.TeamCreate(ctx, api.TeamCreateParams{Slug: "red", Title: "Red"})), "team.create red")
	ok(errOf(ac.TeamCreate(ctx, api.TeamCreateParams{Slug: "blue", Title: "Blue"})), "team.create blue")
	ok(errOf(ac.UserAdd(ctx, api.UserAddParams{Username: "carol", Team: "red"})), "user.add carol")
	ok(errOf(ac.UserAdd(ctx, api.UserAddParams{Username: "bob", Team: "blue"})), "user.add bob")
	ok(errOf(ac.TeamAddMember(ctx, api.TeamMemberParams{Team: "red", Username: "alice", Role: "member"})), "team.addMember")
	ok(errOf(ac.TeamRemoveMember(ctx, api.TeamMemberParams{Team: model.DefaultTeam, Username: "alice"})), "team.removeMember")
	alice := f.Dial("alice")
	f.alice = alice
	c := f.client()
	ok(errOf(c.CredentialAdd(ctx, api.CredentialAddParams{Provider: "dummy", Title: "red cred", Team: "red", Data: json.RawMessage(`{"token":"red-token"}`)})), "credential.add red")
	bob, carol := f.Dial("bob"), f.Dial("carol")
	ok(errOf(api.NewClient(bob).CredentialAdd(ctx, api.CredentialAddParams{Provider: "dummy", Title: "blue cred", Data: json.RawMessage(`{"token":"blue-token"}`)})), "credential.add blue")

	tpl, err := c.TemplateCreate(ctx, api.TemplateParams{Title: "t", Team: "red", Files: map[string]string{"main.tf": twoVMs}})
	ok(err, "template.create")
	created, err := c.StackCreate(ctx, api.StackPlanParams{TemplateID: tpl.ID})
	ok(err, "stack.create")
	sid, mid := created.Stack.ID, created.Machines[0].ID

	is := func(target error) func(error) bool { return func(err error) bool { return errors.Is(err, target) } }
	none := func(err error) bool { return err == nil }
	type row struct {
		method string
		params any
		want   map[string]func(error) bool
	}
	users := map[string]*kite.Conn{"alice": alice, "carol": carol, "bob": bob, "admin": admin}
	rows := []row{
		{"template.get", api.TemplateGetParams{TemplateID: tpl.ID}, map[string]func(error) bool{"alice": none, "carol": none, "bob": is(kite.ErrNotFound), "admin": none}},
		{"template.update", api.TemplateParams{TemplateID: tpl.ID, Title: "renamed"}, map[string]func(error) bool{"alice": none, "carol": is(kite.ErrPermission), "bob": is(kite.ErrNotFound), "admin": none}},
		{"template.delete", api.TemplateRef{TemplateID: tpl.ID}, map[string]func(error) bool{"carol": is(kite.ErrPermission), "bob": is(kite.ErrNotFound)}},
		{"stack.plan", api.StackPlanParams{TemplateID: tpl.ID}, map[string]func(error) bool{"alice": none, "carol": none, "bob": is(kite.ErrNotFound)}},
		{"stack.create", api.StackPlanParams{TemplateID: tpl.ID}, map[string]func(error) bool{"bob": is(kite.ErrNotFound)}},
		{"stack.describe", api.StackRef{StackID: sid}, map[string]func(error) bool{"alice": none, "carol": is(kite.ErrNotFound), "bob": is(kite.ErrNotFound), "admin": none}},
		{"stack.apply", api.StackApplyParams{StackID: sid, Destroy: true}, map[string]func(error) bool{"carol": is(kite.ErrNotFound), "bob": is(kite.ErrNotFound)}},
		{"machine.info", api.MachineRef{MachineID: mid}, map[string]func(error) bool{"alice": none, "carol": is(kite.ErrNotFound), "bob": is(kite.ErrNotFound), "admin": none}},
		{"machine.start", api.MachineRef{MachineID: mid}, map[string]func(error) bool{"alice": is(kite.ErrState), "carol": is(kite.ErrNotFound), "bob": is(kite.ErrNotFound)}},
		{"machine.stop", api.MachineRef{MachineID: mid}, map[string]func(error) bool{"alice": is(kite.ErrState), "carol": is(kite.ErrNotFound), "bob": is(kite.ErrNotFound), "admin": is(kite.ErrState)}},
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
	for who, conn := range map[string]*kite.Conn{"carol": carol, "bob": bob} {
		c := api.NewClient(conn)
		ms, err := c.MachineList(ctx, api.MachineListParams{})
		ok(err, "machine.list")
		ss, err := c.StackList(ctx, api.StackListParams{})
		ok(err, "stack.list")
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
		tl, err := c.TemplateList(ctx, api.TemplateListParams{})
		ok(err, "template.list")
		if who == "bob" && len(tl.Templates) != 0 {
			t.Errorf("bob lists red's templates: %+v", tl.Templates)
		}
	}
	if _, err := api.NewClient(bob).StackList(ctx, api.StackListParams{All: true, Team: "red"}); !errors.Is(err, kite.ErrPermission) {
		t.Errorf("bob listing red's stacks: %v", err)
	}
	// A job of alice's: destroying her (never built) stack.
	f.follow(f.apply(sid, true))
	jobs, err := c.JobList(ctx, api.JobListParams{})
	ok(err, "job.list")
	if len(jobs.Jobs) == 0 {
		t.Fatal("alice has no jobs")
	}
	for _, j := range jobs.Jobs {
		for who, c := range map[string]*kite.Conn{"carol": carol, "bob": bob} {
			if _, err := api.NewClient(c).JobGet(ctx, api.JobRef{JobID: j.ID}); !errors.Is(err, kite.ErrNotFound) {
				t.Errorf("job.get of alice's job as %s: %v", who, err)
			}
		}
	}
}
