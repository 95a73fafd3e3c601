package kloud

import (
	"slices"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
)

// TestEveryRouteIsAuditDecided: every kloud method (api.KloudMethods, which TestMethodTable
// holds equal to the route table) is decided in auditDecisions, audited or read-only, and
// nothing else is listed there. A new method fails here until its author decides.
func TestEveryRouteIsAuditDecided(t *testing.T) {
	t.Parallel()
	d := auditDecisions()
	for _, m := range api.KloudMethods() {
		if _, ok := d[m]; !ok {
			t.Errorf("%s: not decided in auditDecisions (routes.go): does it change anything?", m)
		}
	}
	for m := range d {
		if !slices.Contains(api.KloudMethods(), m) {
			t.Errorf("%s: in auditDecisions but not a kloud method", m)
		}
	}
	dk := auditKontrolDecisions()
	for _, m := range api.KontrolMethods() {
		if _, ok := dk[m]; !ok {
			t.Errorf("%s: not decided in auditKontrolDecisions (audit.go)", m)
		}
	}
	if len(dk) != len(api.KontrolMethods()) {
		t.Errorf("auditKontrolDecisions has %d methods, api.KontrolMethods %d", len(dk), len(api.KontrolMethods()))
	}
	// The obvious ones, both ways.
	for _, m := range []string{api.MethodStackApply, api.MethodCredentialAdd, api.MethodUserSetPassword, api.MethodQuotaSet, api.MethodMachineStop} {
		if !auditedMethod(m) {
			t.Errorf("%s is not audited", m)
		}
	}
	for _, m := range []string{api.MethodStackList, api.MethodAuditList, api.MethodJobWatch, api.MethodVersion} {
		if auditedMethod(m) {
			t.Errorf("%s is audited", m)
		}
	}
	if !auditedMethod("some.newMethod") {
		t.Error("a method missing from the list is not audited")
	}
}

// TestAuditTarget: the target is the most specific id the params name, and nothing else of
// them.
func TestAuditTarget(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		method string
		v      any
		want   string
	}{
		{api.MethodMachineShare, &api.ShareParams{MachineID: "m1", Username: "bob", Grant: "full"}, "machine/m1"},
		{api.MethodStackApply, &api.StackApplyParams{StackID: "s1"}, "stack/s1"},
		{api.MethodQuotaSet, &api.QuotaSetParams{QuotaSubject: api.QuotaSubject{Team: "red"}}, "team/red"},
		{api.MethodUserAdd, &api.UserAddParams{Username: "dave", Password: "secret"}, "user/dave"},
		{api.MethodCredentialAdd, &api.CredentialAddResult{ID: "c1"}, "credential/c1"},
		{api.MethodCredentialUpdate, &api.CredentialUpdateParams{CredentialID: "c1", Data: []byte(`{"secret":"x"}`)}, "credential/c1"},
		{api.MethodVersion, &api.NoParams{}, ""},
	} {
		if got := auditTarget(c.method, c.v); got != c.want {
			t.Errorf("%s %+v: %q, want %q", c.method, c.v, got, c.want)
		}
	}
	for _, c := range []struct {
		method string
		v      any
		want   string
	}{
		{api.MethodStackCreate, api.StackCreateResult{Stack: model.Stack{ID: "s1", TemplateID: "t1"}}, "stack/s1"},
		{api.MethodTemplateCreate, model.Template{ID: "t1", Team: "red"}, "template/t1"},
		{api.MethodCredentialAdd, api.CredentialAddResult{ID: "c1"}, "credential/c1"},
		{api.MethodTeamCreate, model.Team{Slug: "red"}, "team/red"},
		{api.MethodMachineSnapshot, api.SnapshotStarted{JobID: "j1", SnapshotID: "sn1"}, "snapshot/sn1"},
	} {
		if got := createdTarget(c.method, c.v); got != c.want {
			t.Errorf("created by %s %+v: %q, want %q", c.method, c.v, got, c.want)
		}
	}
	for _, c := range []struct {
		method string
		v      any
		want   string
	}{
		{api.MethodVersion, nil, ""},
	} {
		if got := auditTarget(c.method, c.v); got != c.want {
			t.Errorf("%s %+v: %q, want %q", c.method, c.v, got, c.want)
		}
	}
}

// TestAuditText: a target with a newline cannot forge a line of the table; a long one is cut.
func TestAuditText(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"stack/abc":                 "stack/abc",
		"stack/a\n9 admin user.add": `stack/a\n9 admin user.add`,
		"stack/\x00\u2028é":         `stack/\x00\u2028é`,
		strings.Repeat("é", 150):    strings.Repeat("é", 100) + "…",
	} {
		if got := auditText(in); got != want {
			t.Errorf("auditText(%q) = %q, want %q", in, got, want)
		}
	}
}
