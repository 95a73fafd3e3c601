package store_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/kloud/store/storetest"
)

func TestReposNotFoundAndConflict(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, b backend) {
		ctx := ctxT(t)
		s := b.open(t, store.Options{})
		now := s.Now()
		if _, err := s.Users().Get(ctx, "nobody"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("missing user: %v", err)
		}
		if err := s.Users().Insert(ctx, model.User{Username: "alice", CreatedAt: now}); err != nil {
			t.Fatal(err)
		}
		if err := s.Users().Insert(ctx, model.User{Username: "alice", CreatedAt: now}); !errors.Is(err, store.ErrConflict) {
			t.Fatalf("second alice: %v", err)
		}
		if ok, err := s.Users().Exists(ctx, "alice"); err != nil || !ok {
			t.Fatalf("alice exists: %t %v", ok, err)
		}
		if err := s.Users().SetPassword(ctx, "bob", "h", false); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("password of a missing user: %v", err)
		}
		if err := s.Users().SetPassword(ctx, "admin", "h", true); err != nil {
			t.Fatal(err)
		}
		if u, err := s.Users().Get(ctx, "admin"); err != nil || !u.Admin || u.PasswordHash != "h" {
			t.Fatalf("created admin: %+v %v", u, err)
		}
		for _, get := range []func() error{
			func() error { _, err := s.Teams().Get(ctx, "x"); return err },
			func() error { _, err := s.Credentials().Get(ctx, "x"); return err },
			func() error { _, err := s.Templates().Get(ctx, "x"); return err },
			func() error { _, err := s.Stacks().Get(ctx, "x"); return err },
			func() error { _, err := s.Machines().Get(ctx, "x"); return err },
			func() error { _, err := s.Machines().ByKite(ctx, "x"); return err },
			func() error { return s.Stacks().Set(ctx, "x", store.StackSet{Reason: new("r")}) },
			func() error { return s.Machines().Set(ctx, "x", store.MachineSet{Reason: new("r")}) },
			func() error { return s.Templates().SetTrust(ctx, "x", nil) },
		} {
			if err := get(); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("missing document: %v", err)
			}
		}
	})
}

func TestStacksTransitionsAndReset(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, b backend) {
		ctx := ctxT(t)
		s := b.open(t, store.Options{})
		st := model.Stack{ID: "s1", Owner: "alice", Team: "red", State: model.StackNotInitialized, Machines: []string{}, CreatedAt: s.Now()}
		if err := s.Stacks().Insert(ctx, st); err != nil {
			t.Fatal(err)
		}
		// No job recorded: the job condition "" matches a missing jobId.
		if ok, err := s.Stacks().TransitionOfJob(ctx, "s1", []string{model.StackNotInitialized}, "j0", store.StackSet{State: new(model.StackFailed)}); err != nil || ok {
			t.Fatalf("transition of another job: %t %v", ok, err)
		}
		if ok, err := s.Stacks().Transition(ctx, "s1", []string{model.StackNotInitialized}, store.StackSet{State: new(model.StackBuilding), JobID: new("j1")}); err != nil || !ok {
			t.Fatalf("build: %t %v", ok, err)
		}
		if ok, err := s.Stacks().Transition(ctx, "s1", []string{model.StackNotInitialized}, store.StackSet{State: new(model.StackBuilding)}); err != nil || ok {
			t.Fatalf("second build: %t %v", ok, err)
		}
		if err := s.Stacks().Set(ctx, "s1", store.StackSet{TFJobID: new("tf-1")}); err != nil {
			t.Fatal(err)
		}
		if ok, err := s.Stacks().Reset(ctx, "s1", model.StackBuilding, "j0", store.StackSet{State: new(model.StackFailed)}, model.StackReset{By: "admin"}); err != nil || ok {
			t.Fatalf("reset with a stale job: %t %v", ok, err)
		}
		if ok, err := s.Stacks().Reset(ctx, "s1", model.StackBuilding, "j1", store.StackSet{State: new(model.StackFailed), Reason: new("INC-1")},
			model.StackReset{By: "admin", From: model.StackBuilding, To: model.StackFailed, Job: "j1", Reason: "INC-1"}); err != nil || !ok {
			t.Fatalf("reset: %t %v", ok, err)
		}
		got, err := s.Stacks().Get(ctx, "s1")
		if err != nil {
			t.Fatal(err)
		}
		if got.State != model.StackFailed || got.Reason != "INC-1" || got.JobID != "j1" || got.TFJobID != "tf-1" || len(got.Resets) != 1 || got.Resets[0].By != "admin" {
			t.Fatalf("after reset: %+v", got)
		}
		if l, err := s.Stacks().InStates(ctx, []string{model.StackFailed}); err != nil || len(l) != 1 {
			t.Fatalf("failed stacks: %v %v", l, err)
		}
		if l, err := s.Stacks().List(ctx, store.StackFilter{Owner: "bob"}); err != nil || len(l) != 0 {
			t.Fatalf("bob's stacks: %v %v", l, err)
		}
		if l, err := s.Stacks().List(ctx, store.StackFilter{}); err != nil || len(l) != 0 {
			t.Fatalf("empty filter: %v %v", l, err)
		}
		if l, err := s.Stacks().List(ctx, store.StackFilter{All: true}); err != nil || len(l) != 1 {
			t.Fatalf("every stack: %v %v", l, err)
		}
		if err := s.Stacks().Delete(ctx, "s1"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Stacks().Get(ctx, "s1"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("deleted stack: %v", err)
		}
	})
}

func TestMachinesQueriesAndConditionalWrites(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, b backend) {
		ctx := ctxT(t)
		s := b.open(t, store.Options{})
		now := s.Now()
		ms := []model.Machine{
			{ID: "m1", StackID: "s1", Label: "b", Owner: "alice", Team: "red", State: "Running", KiteID: "k1", CreatedAt: now, UpdatedAt: now},
			{ID: "m2", StackID: "s1", Label: "a", Owner: "alice", Team: "red", State: "Building", CreatedAt: now, UpdatedAt: now,
				Shares: []model.Share{{Username: "bob", Grant: model.GrantReadonly}}},
			{ID: "m3", StackID: "s2", Label: "c", Owner: "carol", Team: "blue", State: "Stopped", CreatedAt: now, UpdatedAt: now},
		}
		if err := s.Machines().InsertMany(ctx, ms); err != nil {
			t.Fatal(err)
		}
		if err := s.Machines().InsertMany(ctx, ms[:1]); !errors.Is(err, store.ErrConflict) {
			t.Fatalf("duplicate machine: %v", err)
		}
		ids := func(l []model.Machine, err error) []string {
			t.Helper()
			if err != nil {
				t.Fatal(err)
			}
			var out []string
			for _, m := range l {
				out = append(out, m.ID)
			}
			return out
		}
		if got := ids(s.Machines().ByStack(ctx, "s1")); !slices.Equal(got, []string{"m2", "m1"}) {
			t.Errorf("by stack (by label): %v", got)
		}
		if got := ids(s.Machines().List(ctx, store.MachineFilter{Visible: "bob"})); !slices.Equal(got, []string{"m2"}) {
			t.Errorf("visible to bob: %v", got)
		}
		if got := ids(s.Machines().List(ctx, store.MachineFilter{Visible: "alice", StackID: "s2"})); len(got) != 0 {
			t.Errorf("alice's in s2: %v", got)
		}
		if got := ids(s.Machines().List(ctx, store.MachineFilter{Team: "blue"})); !slices.Equal(got, []string{"m3"}) {
			t.Errorf("team blue: %v", got)
		}
		if got := ids(s.Machines().InStates(ctx, []string{"Building", "Stopped"})); len(got) != 2 {
			t.Errorf("in transition or stopped: %v", got)
		}
		if ok, err := s.Machines().InStack(ctx, "s2", "m1"); err != nil || ok {
			t.Errorf("m1 in s2: %t %v", ok, err)
		}
		if ok, err := s.Machines().SharedWith(ctx, "k1", "bob"); err != nil || ok {
			t.Errorf("k1 shared with bob: %t %v", ok, err)
		}
		// Shares change only if nobody changed the machine since it was read.
		m1, err := s.Machines().Get(ctx, "m1")
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Machines().SetAgent(ctx, "k1", model.AgentConnected, "1.2"); err != nil {
			t.Fatal(err)
		}
		if ok, err := s.Machines().SetShares(ctx, "m1", m1.UpdatedAt, []model.Share{{Username: "bob", Grant: model.GrantFull}}); err != nil || !ok {
			t.Fatalf("set shares: %t %v", ok, err)
		}
		if ok, err := s.Machines().SetShares(ctx, "m1", m1.UpdatedAt, nil); err != nil || ok {
			t.Fatalf("set shares on a stale read: %t %v", ok, err)
		}
		if ok, err := s.Machines().SharedWith(ctx, "k1", "bob"); err != nil || !ok {
			t.Errorf("k1 shared with bob: %t %v", ok, err)
		}
		m1, err = s.Machines().ByKite(ctx, "k1")
		if err != nil || m1.Agent.Status != model.AgentConnected || m1.Agent.Version != "1.2" || m1.Agent.LastSeen.IsZero() {
			t.Fatalf("agent of m1: %+v %v", m1.Agent, err)
		}
		if ok, err := s.Machines().TransitionUnchanged(ctx, "m1", []string{"Running"}, m1.UpdatedAt.Add(-1), store.MachineSet{State: new("Unknown")}); err != nil || ok {
			t.Fatalf("transition on a stale read: %t %v", ok, err)
		}
		if ok, err := s.Machines().Transition(ctx, "m1", []string{"Running"}, store.MachineSet{State: new("Stopping"), Meta: map[string]any{"x": "y"}}); err != nil || !ok {
			t.Fatalf("stop: %t %v", ok, err)
		}
		if err := s.Machines().DeleteByStack(ctx, "s1"); err != nil {
			t.Fatal(err)
		}
		if got := ids(s.Machines().List(ctx, store.MachineFilter{})); len(got) != 0 {
			t.Errorf("empty filter: %v", got)
		}
		if got := ids(s.Machines().List(ctx, store.MachineFilter{All: true})); !slices.Equal(got, []string{"m3"}) {
			t.Errorf("after deleting s1's machines: %v", got)
		}
	})
}

func TestCredentialBootstrapClaim(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, b backend) {
		ctx := ctxT(t)
		s := b.open(t, store.Options{})
		now := s.Now()
		cr := model.Credential{ID: "c1", Provider: "p", Team: "red", Owner: "alice", Bootstrap: &model.Bootstrap{Status: model.BootstrapNone, UpdatedAt: now}, CreatedAt: now}
		if err := s.Credentials().Insert(ctx, cr); err != nil {
			t.Fatal(err)
		}
		if ok, err := s.Credentials().ClaimBootstrap(ctx, "c1", model.BootstrapRunning, false, nil); err != nil || !ok {
			t.Fatalf("claim: %t %v", ok, err)
		}
		if ok, err := s.Credentials().ClaimBootstrap(ctx, "c1", model.BootstrapRunning, false, nil); err != nil || ok {
			t.Fatalf("second claim: %t %v", ok, err)
		}
		if ok, err := s.Credentials().DeleteIdle(ctx, "c1"); err != nil || ok {
			t.Fatalf("delete while bootstrapping: %t %v", ok, err)
		}
		if ok, err := s.Credentials().SetBootstrapJob(ctx, "c1", "j1"); err != nil || !ok {
			t.Fatalf("record job: %t %v", ok, err)
		}
		if ok, err := s.Credentials().SetBootstrapJob(ctx, "c1", "j2"); err != nil || ok {
			t.Fatalf("another job: %t %v", ok, err)
		}
		if ok, err := s.Credentials().UpdateBootstrap(ctx, "c1", "j2", store.BootstrapSet{Status: new(model.BootstrapFailed)}); err != nil || ok {
			t.Fatalf("update by another job: %t %v", ok, err)
		}
		sealed := []byte("s")
		if ok, err := s.Credentials().UpdateBootstrap(ctx, "c1", "j1", store.BootstrapSet{Status: new(model.BootstrapDone), Sealed: &sealed, Outputs: &[]string{"vpc"}}); err != nil || !ok {
			t.Fatalf("finish: %t %v", ok, err)
		}
		got, err := s.Credentials().Get(ctx, "c1")
		if err != nil {
			t.Fatal(err)
		}
		if b := got.Bootstrap; b.Status != model.BootstrapDone || string(b.Sealed) != "s" || !slices.Equal(b.Outputs, []string{"vpc"}) || b.JobID != "j1" {
			t.Fatalf("bootstrap: %+v", b)
		}
		// Done: only a destroy claims it; then a stale claim is taken over exactly as read.
		if ok, _ := s.Credentials().ClaimBootstrap(ctx, "c1", model.BootstrapRunning, false, nil); ok {
			t.Fatal("a build claimed a done bootstrap")
		}
		if ok, err := s.Credentials().ClaimBootstrap(ctx, "c1", model.BootstrapDestroying, true, nil); err != nil || !ok {
			t.Fatalf("destroy claim: %t %v", ok, err)
		}
		got, _ = s.Credentials().Get(ctx, "c1")
		stale := *got.Bootstrap
		stale.UpdatedAt = stale.UpdatedAt.Add(-1)
		if ok, err := s.Credentials().ClaimBootstrap(ctx, "c1", model.BootstrapDestroying, true, &stale); err != nil || ok {
			t.Fatalf("take-over of a changed claim: %t %v", ok, err)
		}
		if ok, err := s.Credentials().ClaimBootstrap(ctx, "c1", model.BootstrapDestroying, true, got.Bootstrap); err != nil || !ok {
			t.Fatalf("take-over: %t %v", ok, err)
		}
		if err := s.Credentials().SetVerified(ctx, "c1", true, ""); err != nil {
			t.Fatal(err)
		}
		l, err := s.Credentials().List(ctx, store.CredentialFilter{Teams: []string{"blue"}})
		if err != nil || len(l) != 0 {
			t.Fatalf("blue's credentials: %v %v", l, err)
		}
		if l, err = s.Credentials().List(ctx, store.CredentialFilter{Provider: "p"}); err != nil || len(l) != 0 {
			t.Fatalf("credentials of no team: %+v %v", l, err)
		}
		if l, err = s.Credentials().List(ctx, store.CredentialFilter{AllTeams: true, Provider: "p"}); err != nil || len(l) != 1 || !l[0].Verified {
			t.Fatalf("p's credentials: %+v %v", l, err)
		}
	})
}

func TestTemplatesUpdateAndTrust(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, b backend) {
		ctx := ctxT(t)
		s := b.open(t, store.Options{})
		now := s.Now()
		tpl := model.Template{ID: "t1", Title: "web", Team: "red", Owner: "alice", Rev: 1, Files: []model.File{{Name: "main.tf", Content: "a"}}, CreatedAt: now}
		if err := s.Templates().Insert(ctx, tpl); err != nil {
			t.Fatal(err)
		}
		up := store.TemplateUpdate{Files: []model.File{{Name: "main.tf", Content: "b"}}, Rev: 2, Revisions: []model.TemplateRevision{{Rev: 1, Files: tpl.Files}}}
		if ok, err := s.Templates().Update(ctx, "t1", 1, up); err != nil || !ok {
			t.Fatalf("update: %t %v", ok, err)
		}
		if ok, err := s.Templates().Update(ctx, "t1", 1, store.TemplateUpdate{Title: "x"}); err != nil || ok {
			t.Fatalf("update of a stale revision: %t %v", ok, err)
		}
		if err := s.Templates().SetTrust(ctx, "t1", []model.TemplateTrust{{Rev: 2, Digest: "d", By: "admin"}}); err != nil {
			t.Fatal(err)
		}
		if l, err := s.Templates().Trusted(ctx, "red"); err != nil || len(l) != 1 || l[0].Trust[0].Digest != "d" {
			t.Fatalf("trusted: %+v %v", l, err)
		}
		if err := s.Templates().SetTrust(ctx, "t1", nil); err != nil {
			t.Fatal(err)
		}
		if l, err := s.Templates().Trusted(ctx, "red"); err != nil || len(l) != 0 {
			t.Fatalf("trusted after untrust: %+v %v", l, err)
		}
		got, err := s.Templates().ByTitle(ctx, "red", "web")
		if err != nil || got.Rev != 2 || got.Files[0].Content != "b" || len(got.Revisions) != 1 {
			t.Fatalf("by title: %+v %v", got, err)
		}
		if l, err := s.Templates().OfTeams(ctx, nil); err != nil || len(l) != 0 {
			t.Fatalf("templates of no team: %v %v", l, err)
		}
		if l, err := s.Templates().List(ctx); err != nil || len(l) != 1 {
			t.Fatalf("every template: %v %v", l, err)
		}
	})
}

func TestStoretestSetFieldsAndRaw(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	s := storetest.New(t)
	if err := s.Teams().Insert(ctx, model.Team{Slug: "red", Title: "Red", Members: []model.Member{{Username: "alice", Role: model.RoleAdmin}}}); err != nil {
		t.Fatal(err)
	}
	storetest.SetFields(t, s, store.CollTeams, "red", map[string]any{"title": "Old red"})
	if raw := storetest.Raw(t, s, store.CollTeams, "red"); raw.Lookup("title").StringValue() != "Old red" {
		t.Fatalf("raw team: %s", raw)
	}
	if l, err := s.Teams().OfMember(ctx, "alice"); err != nil || len(l) != 1 || l[0].Title != "Old red" {
		t.Fatalf("alice's teams: %+v %v", l, err)
	}
	if ok, err := s.Teams().SetMembers(ctx, "red", nil, []model.Member{}); err != nil || ok {
		t.Fatalf("members changed from a stale list: %t %v", ok, err)
	}
}

// SetKiteIDs writes every machine's kite id and agent record in one call; a missing machine is
// ErrNotFound and does not stop the others.
func TestMachinesSetKiteIDs(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, b backend) {
		ctx := ctxT(t)
		s := b.open(t, store.Options{})
		now := s.Now()
		ms := []model.Machine{
			{ID: "m1", StackID: "s1", Label: "a", Owner: "alice", State: "Building", KiteID: "old", Agent: model.Agent{Status: model.AgentConnected}, CreatedAt: now, UpdatedAt: now},
			{ID: "m2", StackID: "s1", Label: "b", Owner: "alice", State: "Building", CreatedAt: now, UpdatedAt: now},
		}
		if err := s.Machines().InsertMany(ctx, ms); err != nil {
			t.Fatal(err)
		}
		if err := s.Machines().SetKiteIDs(ctx, map[string]string{"m1": "k1", "m2": "k2"}, model.Agent{Status: model.AgentNever}); err != nil {
			t.Fatal(err)
		}
		for id, want := range map[string]string{"m1": "k1", "m2": "k2"} {
			m, err := s.Machines().Get(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if m.KiteID != want || m.Agent.Status != model.AgentNever || !m.UpdatedAt.After(now) && !m.UpdatedAt.Equal(now) {
				t.Fatalf("%s: kite %q agent %+v, want %q never seen", id, m.KiteID, m.Agent, want)
			}
		}
		err := s.Machines().SetKiteIDs(ctx, map[string]string{"m1": "k3", "gone": "k4"}, model.Agent{Status: model.AgentNever})
		if !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("a missing machine: %v", err)
		}
		if m, _ := s.Machines().Get(ctx, "m1"); m.KiteID != "k3" {
			t.Fatalf("m1 not written beside a missing machine: %q", m.KiteID)
		}
	})
}
