package kloud_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/kloud/store/storetest"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/dummy"
)

// rolesEnv is a kloud with alice (a member, admin of team red, with a template there), and the
// users aud, tad and bob (members of default only), aud made an auditor and tad a template
// admin by the admin (user.setRole).
type rolesEnv struct {
	*kloudtest.Env
	tpl model.Template
}

func newRolesEnv(t *testing.T) *rolesEnv {
	reg := provider.NewRegistry()
	reg.Register(dummy.New(dummy.Options{Dir: dummyDir(t)})) // templates need a provider's resource
	e := &rolesEnv{Env: kloudtest.Start(t, kloudtest.Options{Providers: reg})}
	ctx := t.Context()
	admin := e.Client(kloud.Admin)
	for _, u := range []string{"alice", "aud", "tad", "bob"} {
		if _, err := admin.UserAdd(ctx, api.UserAddParams{Username: u, Email: u + "@corp.example", Team: model.DefaultTeam}); err != nil {
			t.Fatal(err)
		}
	}
	alice := e.Client("alice")
	if _, err := alice.TeamCreate(ctx, api.TeamCreateParams{Slug: "red"}); err != nil {
		t.Fatal(err)
	}
	var err error
	e.tpl, err = alice.TemplateCreate(ctx, api.TemplateParams{Title: "red box", Team: "red",
		Files: map[string]string{"main.tf": twoVMs}})
	if err != nil {
		t.Fatal(err)
	}
	for u, r := range map[string]string{"aud": model.RoleAuditor, "tad": model.RoleTemplateAdmin} {
		v, err := admin.UserSetRole(ctx, api.SetRoleParams{Username: u, Role: r})
		if err != nil || v.Role != r {
			t.Fatalf("user.setRole %s %s: %+v, %v", u, r, v, err)
		}
	}
	return e
}

// TestRolesAuditor: an auditor gets -32002 from every method of the route table that changes
// something (called with empty params: the role is checked before the params), and not from one
// that changes nothing; in those it sees what an owner sees: another team's template, every
// user with their email.
func TestRolesAuditor(t *testing.T) {
	t.Parallel()
	e := newRolesEnv(t)
	ctx := t.Context()
	aud := e.Dial("aud")
	checked := 0
	for _, r := range e.Server.Routes() {
		if r.Who == kloud.PluginsOnly || r.Who == kloud.ReplicasOnly {
			continue
		}
		// Raw params on purpose: the same {} for every method of the table (the route's check
		// comes before its params).
		err := aud.Call(ctx, r.Method, map[string]any{}, new(json.RawMessage))
		if r.Who.ReadOnly() {
			if errors.Is(err, kite.ErrPermission) {
				t.Errorf("%s (%s): an auditor got %v", r.Method, r.Who, err)
			}
			continue
		}
		checked++
		if !errors.Is(err, kite.ErrPermission) {
			t.Errorf("%s (%s): an auditor got %v, want -32002", r.Method, r.Who, err)
		}
	}
	if checked < 30 {
		t.Fatalf("only %d mutating methods in the route table", checked)
	}

	ac := api.NewClient(aud)
	who, err := ac.UserWhoami(ctx)
	if err != nil || who.Role != model.RoleAuditor || who.Admin {
		t.Fatalf("whoami of the auditor: %+v, %v", who, err)
	}
	list, err := ac.TemplateList(ctx, api.TemplateListParams{})
	if err != nil || !slices.ContainsFunc(list.Templates, func(v api.TemplateSummary) bool { return v.ID == e.tpl.ID }) {
		t.Fatalf("the auditor's template.list misses red's template: %+v, %v", list, err)
	}
	bob, err := e.Client("bob").TemplateList(ctx, api.TemplateListParams{})
	if err != nil || slices.ContainsFunc(bob.Templates, func(v api.TemplateSummary) bool { return v.ID == e.tpl.ID }) {
		t.Fatalf("bob (a member outside red) lists red's template: %+v, %v", bob, err)
	}
	users, err := ac.UserList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range users.Users {
		if u.Username == "alice" && u.Email != "alice@corp.example" {
			t.Fatalf("the auditor's user.list hides alice's email: %+v", u)
		}
	}
	if len(users.Users) < 5 {
		t.Fatalf("the auditor's user.list: %+v", users.Users)
	}
}

// TestRolesTemplateAdmin: a template admin trusts and untrusts a template of a team it is not
// in, but may not set quotas, reset stacks or give roles; a member may not trust.
func TestRolesTemplateAdmin(t *testing.T) {
	t.Parallel()
	e := newRolesEnv(t)
	ctx := t.Context()
	trust := api.TrustParams{TemplateID: e.tpl.ID, Rules: []string{"provisioner"}, Reason: "reviewed"}
	if _, err := e.Client("bob").TemplateTrust(ctx, trust); !errors.Is(err, kite.ErrPermission) {
		t.Fatalf("a member trusted a template: %v", err)
	}
	tad := e.Client("tad")
	tr, err := tad.TemplateTrust(ctx, trust)
	if err != nil || tr.By != "tad" {
		t.Fatalf("template admin's trust: %+v, %v", tr, err)
	}
	if err := e.Dial("tad").Call(ctx, api.MethodTemplateUntrust, api.TrustParams{TemplateID: e.tpl.ID}, nil); err != nil {
		t.Fatalf("template admin's untrust: %v", err)
	}
	if err := e.Dial("tad").Call(ctx, api.MethodQuotaSet, api.QuotaSetParams{QuotaSubject: api.QuotaSubject{User: "bob"}, Limit: api.Quota{Machines: 1}}, nil); !errors.Is(err, kite.ErrPermission) {
		t.Fatalf("a template admin set a quota: %v", err)
	}
	if _, err := tad.UserSetRole(ctx, api.SetRoleParams{Username: "tad", Role: model.RoleOwner}); !errors.Is(err, kite.ErrPermission) {
		t.Fatalf("a template admin made itself an owner: %v", err)
	}
}

// TestRolesOwners: an admin of before roles (admin flag, no role) is an owner; an owner's role
// set to member takes effect on its open session at once (the session's admin claim is not
// believed over the user's record); the built-in admin's role cannot be changed.
func TestRolesOwners(t *testing.T) {
	t.Parallel()
	e := newRolesEnv(t)
	ctx := t.Context()
	admin := e.Client(kloud.Admin)
	if _, err := admin.UserAdd(ctx, api.UserAddParams{Username: "olivia", Admin: true}); err != nil {
		t.Fatal(err)
	}
	storetest.SetFields(t, e.Server.Store(), store.CollUsers, "olivia", map[string]any{"role": ""}) // as before roles
	sess, err := e.Server.Signer().Session("olivia", true, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	oconn := e.DialAuth(kite.Auth{Type: kite.AuthSession, Key: sess})
	olivia := api.NewClient(oconn)
	who, err := olivia.UserWhoami(ctx)
	if err != nil || who.Role != model.RoleOwner || !who.Admin {
		t.Fatalf("whoami of an admin of before roles: %+v, %v", who, err)
	}
	quota := api.QuotaSetParams{QuotaSubject: api.QuotaSubject{User: "bob"}, Limit: api.Quota{Machines: 2}}
	if err := oconn.Call(ctx, api.MethodQuotaSet, quota, nil); err != nil {
		t.Fatalf("an owner's quota.set: %v", err)
	}
	users, err := admin.UserList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range users.Users {
		if want := map[string]string{"olivia": model.RoleOwner, "aud": model.RoleAuditor, "bob": model.RoleUser, kloud.Admin: model.RoleOwner}[u.Username]; want != "" && u.Role != want {
			t.Errorf("user.list: %s has role %q, want %q", u.Username, u.Role, want)
		}
	}
	if _, err := admin.UserSetRole(ctx, api.SetRoleParams{Username: "olivia", Role: model.RoleUser}); err != nil {
		t.Fatal(err)
	}
	if err := oconn.Call(ctx, api.MethodQuotaSet, quota, nil); !errors.Is(err, kite.ErrPermission) {
		t.Fatalf("a demoted owner's open session set a quota: %v", err)
	}
	if _, err := admin.UserSetRole(ctx, api.SetRoleParams{Username: kloud.Admin, Role: model.RoleAuditor}); !errors.Is(err, kite.ErrInvalidParams) {
		t.Fatalf("user.setRole admin auditor: %v", err)
	}
	if _, err := admin.UserSetRole(ctx, api.SetRoleParams{Username: "nobody", Role: model.RoleAuditor}); !errors.Is(err, kite.ErrNotFound) {
		t.Fatalf("user.setRole of a user that does not exist: %v", err)
	}
	if _, err := admin.UserSetRole(ctx, api.SetRoleParams{Username: "bob", Role: "superuser"}); !errors.Is(err, kite.ErrInvalidParams) {
		t.Fatalf("user.setRole with an unknown role: %v", err)
	}
}

// TestMethodTableRoles: docs/protocol.md's row of each method that is not for every member
// names its Who from the route table ("owners", "owners, template admins", …), and the route
// table's read-only methods are the ones docs/protocol.md lists as open to auditors.
func TestMethodTableRoles(t *testing.T) {
	t.Parallel()
	e := kloudtest.Start(t, kloudtest.Options{})
	root, err := testutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "docs", "protocol.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	rows := map[string]string{} // method → its table row
	name := regexp.MustCompile("`([a-zA-Z.]+)`")
	for _, line := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		ns := ""
		for _, m := range name.FindAllStringSubmatch(strings.Split(line, "|")[1], -1) {
			n := m[1]
			if i := strings.LastIndex(n, "."); i >= 0 {
				ns = n[:i]
			} else {
				n = ns + "." + n
			}
			rows[n] = line
		}
	}
	_, roles, _ := strings.Cut(doc, "**Roles.**")
	roles, _, _ = strings.Cut(roles, "\n\n")
	for _, r := range e.Server.Routes() {
		switch r.Who {
		case kloud.Owners, kloud.TemplateAdmins, kloud.OwnersAuditors:
			cells := strings.Split(rows[r.Method], "|")
			if len(cells) < 3 || !strings.HasPrefix(strings.TrimSpace(cells[2]), string(r.Who)) {
				t.Errorf("%s is for %q in the route table; docs/protocol.md says: %s", r.Method, r.Who, rows[r.Method])
			}
		}
		// The roles paragraph lists the auditors' methods by name or by pattern (*.list).
		_, verb, _ := strings.Cut(r.Method, ".")
		listed := strings.Contains(roles, "`"+r.Method+"`") || strings.Contains(roles, "`*."+verb+"`")
		if r.Who.ReadOnly() != listed && r.Who != kloud.PluginsOnly && r.Who != kloud.ReplicasOnly {
			t.Errorf("%s (%s): read-only %v, but the roles paragraph of docs/protocol.md lists it: %v", r.Method, r.Who, r.Who.ReadOnly(), listed)
		}
	}
}
