package kloud_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/provider"
)

const testNewSecret = "sk-NEW-SECRET-0b9f3e71aa"

// TestCredentialUpdate: credential.update merges the change into the stored value (fields left
// out, secrets included, keep their value; null clears), validates it against the provider's
// schema with the old value (immutable fields, ValidUpdate), stores it in one update and resets
// the verification; only the owner and team admins may, and no secret shows anywhere.
func TestCredentialUpdate(t *testing.T) {
	t.Parallel()
	w := newCredWorld(t, kloudtest.Options{})
	data := goodCredData()
	data["account"] = "acct-1"
	id := w.addCred("bob", "bob's key", data)
	var auth api.AuthenticateResult
	w.ok(into(&auth)(w.client("bob").CredentialAuthenticate(w.t.Context(), api.CredentialRef{CredentialID: id})), "credential.authenticate")
	if !auth.Verified {
		t.Fatalf("authenticate: %+v", auth)
	}
	c := api.NewClient(w.as("bob"))
	ctx := t.Context()

	// A plain field changes; the secrets not sent are kept.
	res, err := c.CredentialUpdate(ctx, api.CredentialUpdateParams{CredentialID: id, Data: []byte(`{"region":"us-1","port":8443}`)})
	if err != nil {
		t.Fatal(err)
	}
	if res.ID != id || !slices.Equal(res.Changed, []string{"port", "region"}) {
		t.Errorf("update result %+v", res)
	}
	pc, _, err := w.e.Server.CredentialFor(ctx, "bob", id, "testcloud")
	if err != nil {
		t.Fatal(err)
	}
	if v := *pc.Value.(*testCred); v != (testCred{Region: "us-1", AccessKey: "good-key", SecretKey: testSecretKey, Token: testToken, Port: 8443, Account: "acct-1"}) {
		t.Errorf("after update: %+v", v)
	}
	var d api.CredentialView
	w.ok(into(&d)(w.client("bob").CredentialDescribe(w.t.Context(), api.CredentialRef{CredentialID: id})), "credential.describe")
	if d.Verified || d.Public["region"] != "us-1" || !slices.Equal(d.Secret, []string{"secret_key", "token"}) {
		t.Errorf("described after update: %+v", d)
	}

	// Refusals, with what to do; nothing changes.
	for _, c := range []struct {
		user, data string
		kind       error
		want       string
	}{
		{"bob", `{"account":"acct-2"}`, kite.ErrInvalidParams, `field account (Account) is immutable: it cannot change from "acct-1" to "acct-2"`},
		{"bob", `{"account":null}`, kite.ErrInvalidParams, "field account (Account) is immutable"},
		{"bob", `{"access_key":"new-key"}`, kite.ErrInvalidParams, "access_key changed: send its secret_key too"},
		{"bob", `{"port":"many"}`, kite.ErrInvalidParams, "field port (Port) must be of type integer"},
		{"bob", `{"colour":"red"}`, kite.ErrInvalidParams, "unknown field(s) colour"},
		{"bob", `{"secret_key":""}`, kite.ErrInvalidParams, "field secret_key (Secret key) is required"},
		{"bob", `{"region":"nowhere"}`, kite.ErrInvalidParams, "region \"nowhere\" is not served for secret key [secret]"},
		{"bob", `[1]`, kite.ErrInvalidParams, "data must be a JSON object"},
		{"alice", `{"region":"eu-2"}`, nil, ""}, // a team admin may
		{"carol", `{"region":"eu-3"}`, kite.ErrNotFound, ""},
	} {
		var raw any = c.data
		_, err := w.client(c.user).CredentialUpdate(w.t.Context(), api.CredentialUpdateParams{CredentialID: id, Data: json.RawMessage(c.data)})
		if c.kind == nil && err != nil || c.kind != nil && (!errors.Is(err, c.kind) || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("update %v as %s: %v, want %v %q", raw, c.user, err, c.kind, c.want)
		}
	}
	w.addUser("dave", "", false)
	w.ok(errOf(w.client("alice").TeamAddMember(w.t.Context(), api.TeamMemberParams{Team: "red", Username: "dave"})), "team.addMember")
	wantErr(t, errOf(w.client("dave").CredentialUpdate(w.t.Context(), api.CredentialUpdateParams{CredentialID: id, Data: json.RawMessage(mustJSON(w.t, map[string]any{"region": "x"}))})), kite.ErrPermission, "a member updates another's credential")
	wantErr(t, errOf(w.client("bob").CredentialUpdate(w.t.Context(), api.CredentialUpdateParams{CredentialID: id})), kite.ErrInvalidParams, "no data")

	// A new access key with its secret; a secret cleared with null.
	res, err = c.CredentialUpdate(ctx, api.CredentialUpdateParams{CredentialID: id, Data: []byte(`{"access_key":"other-key","secret_key":"` + testNewSecret + `","token":null}`)})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Changed, []string{"access_key", "secret_key", "token"}) {
		t.Errorf("changed %v", res.Changed)
	}
	pc, _, err = w.e.Server.CredentialFor(ctx, "bob", id, "testcloud")
	if err != nil {
		t.Fatal(err)
	}
	if v := *pc.Value.(*testCred); v != (testCred{Region: "eu-2", AccessKey: "other-key", SecretKey: testNewSecret, Port: 8443, Account: "acct-1"}) {
		t.Errorf("after the second update: %+v", v)
	}
	d = api.CredentialView{}
	w.ok(into(&d)(w.client("bob").CredentialDescribe(w.t.Context(), api.CredentialRef{CredentialID: id})), "credential.describe")
	if !slices.Equal(d.Secret, []string{"secret_key"}) {
		t.Errorf("secret fields after clearing the token: %v", d.Secret)
	}

	// The store's update is a compare-and-swap on the credential as it was read.
	cr, err := w.e.Server.Store().Credentials().Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	ok, err := w.e.Server.Store().Credentials().UpdateValue(ctx, id, cr.UpdatedAt.Add(-time.Second), cr.Sealed, cr.Public, cr.Secret)
	if err != nil || ok {
		t.Errorf("UpdateValue of a stale read: %v %v", ok, err)
	}
	w.scan(testSecretKey, testToken, testNewSecret)
}

// capMachine is a machine that could stop; its provider does not advertise it.
type capMachine struct{}

func (capMachine) Start(context.Context) (any, error) { return nil, nil }
func (capMachine) Stop(context.Context) (any, error)  { return nil, errors.New("must not be called") }
func (capMachine) Info(context.Context) (provider.State, any, error) {
	return provider.Running, nil, nil
}

// TestUnsupportedMethod: a provider without the stop (or info) capability gets machine.stop
// refused with -32005 and a message naming the provider and the method, before any job starts;
// provider.describe lists exactly its capabilities.
func TestUnsupportedMethod(t *testing.T) {
	t.Parallel()
	reg := provider.NewRegistry()
	reg.Register(&provider.Provider{Name: "nostop", ResourceType: "nostop_machine",
		Capabilities: []provider.Capability{provider.CapStart},
		Schema: provider.Schema{NewCredential: func() any {
			return &struct {
				Key string `json:"key"`
			}{}
		}},
		Machine: func(*provider.BaseMachine) (provider.Machine, error) { return capMachine{}, nil }})
	w := newUserWorld(t, kloudtest.Options{Providers: reg})
	w.addUser("alice", "", false)
	ctx := t.Context()
	now := time.Now()
	if err := w.e.Server.Store().Machines().InsertMany(ctx, []model.Machine{{ID: "m1", StackID: "s1", Label: "web", Provider: "nostop",
		Owner: "alice", Team: model.DefaultTeam, State: provider.Running, CreatedAt: now, UpdatedAt: now}}); err != nil {
		t.Fatal(err)
	}
	c := api.NewClient(w.as("alice"))
	_, err := c.MachineStop(ctx, api.MachineRef{MachineID: "m1"})
	var ke *kite.Error
	if !errors.As(err, &ke) || ke.Code != -32005 || !errors.Is(err, kite.ErrState) || !strings.Contains(err.Error(), "machine.stop: provider nostop does not support stop") {
		t.Fatalf("machine.stop on a provider without stop: %v", err)
	}
	m, err := w.e.Server.Store().Machines().Get(ctx, "m1")
	if err != nil || m.State != provider.Running {
		t.Errorf("machine after a refused stop: %+v %v", m, err)
	}
	jobs, err := c.JobList(ctx, api.JobListParams{})
	if err != nil || len(jobs.Jobs) != 0 {
		t.Errorf("jobs after a refused stop: %+v %v", jobs, err)
	}
	// machine.info does not ask a provider without info; it says why.
	info, err := c.MachineInfo(ctx, api.MachineRef{MachineID: "m1"})
	if err != nil || !strings.Contains(info.InfoError, "provider nostop does not support info") || info.State != provider.Running {
		t.Errorf("machine.info: %+v %v", info, err)
	}
	var desc api.ProviderDescribeResult
	w.ok(into(&desc)(w.client("alice").ProviderDescribe(w.t.Context(), api.ProviderDescribeParams{Provider: "nostop"})), "provider.describe")
	if len(desc.Providers) != 1 || !slices.Equal(desc.Providers[0].Capabilities, []provider.Capability{provider.CapStart}) ||
		desc.Providers[0].Kind != provider.KindBuiltin || !strings.Contains(string(desc.Providers[0].Schemas.Credential), `"key"`) {
		t.Errorf("describe: %+v", desc.Providers)
	}
	// credential.bootstrap of a provider without bootstrap: refused the same way.
	var added api.CredentialAddResult
	w.ok(into(&added)(w.client(kloud.Admin).CredentialAdd(w.t.Context(), api.CredentialAddParams{Provider: "nostop", Title: "k", Data: json.RawMessage(mustJSON(w.t, map[string]any{"key": "v"}))})), "credential.add")
	_, err = w.client(kloud.Admin).CredentialBootstrap(w.t.Context(), api.CredentialBootstrapParams{CredentialID: added.ID})
	if !errors.As(err, &ke) || ke.Code != -32005 || !strings.Contains(err.Error(), "credential.bootstrap: provider nostop does not support bootstrap") {
		t.Errorf("credential.bootstrap on a provider without bootstrap: %v", err)
	}
}

// TestCredentialVariablesOfAPlugin: a plugin's credential value is a map (decoded in the
// plugin); its secret variables are the schema's writeOnly fields, not every field; without a
// schema, every field counts as secret.
func TestCredentialVariablesOfAPlugin(t *testing.T) {
	t.Parallel()
	schema := []byte(`{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object","properties":{"token":{"type":"string","writeOnly":true},"region":{"type":"string"}},"additionalProperties":false}`)
	p := &provider.Provider{Name: "plug", Schema: provider.Schema{JSON: map[string]json.RawMessage{provider.PartCredential: schema}}}
	cred := &provider.Credential{Value: map[string]any{"token": "t0k3n", "region": "r1"}, Bootstrap: map[string]any{"net": "n1"}}
	vars, secret := kloud.CredentialVariables(p, cred)
	if len(vars) != 3 || !slices.Equal(secret, []string{"plug_net", "plug_token"}) {
		t.Errorf("vars %v, secret %v (want the token and the schema-less bootstrap output)", vars, secret)
	}
}
