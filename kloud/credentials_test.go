package kloud_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
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
	"github.com/kloud-dev/kloud/terraformer/terraformertest"
	"github.com/kloud-dev/kloud/terraformer/tfapi"
)

// Secrets the test credentials carry; none may show anywhere.
const (
	testSecretKey = "sk-TOP-SECRET-7d1e0c5a93"
	testToken     = "tok-HIDDEN-44b2f0e8c1"
)

// testCred is the test provider's credential: secret and plain fields, defaults, required
// fields, and a Valid that can fail (carelessly quoting a secret, which kloud must redact).
type testCred struct {
	Region    string `json:"region" kloud:"Region" default:"eu-1"`
	AccessKey string `json:"access_key" kloud:"Access key,required"`
	SecretKey string `json:"secret_key" kloud:"Secret key,secret,required"`
	Token     string `json:"token,omitempty" kloud:"Session token,secret"`
	Port      int    `json:"port" kloud:"Port" default:"443"`
	Account   string `json:"account,omitempty" kloud:"Account,immutable"`
}

// ValidUpdate: a new access key comes with a new secret key.
func (c *testCred) ValidUpdate(old any) error {
	if o := old.(*testCred); c.AccessKey != o.AccessKey && c.SecretKey == o.SecretKey {
		return errors.New("access_key changed: send its secret_key too")
	}
	return nil
}

func (c *testCred) Valid() error {
	if c.Region == "nowhere" {
		return fmt.Errorf("region %q is not served for secret key %s", c.Region, c.SecretKey)
	}
	return nil
}

type testBootstrap struct {
	Network string `json:"network" kloud:"Network,required"`
	Key     string `json:"key" kloud:"Deploy key,secret"`
}

type testStack struct{}

// VerifyCredential accepts the access key "good-key" and rejects others, quoting the secret.
func (testStack) VerifyCredential(_ context.Context, c *provider.Credential) error {
	v := c.Value.(*testCred)
	if v.AccessKey != "good-key" {
		return fmt.Errorf("access key %s rejected by testcloud (secret %s)", v.AccessKey, v.SecretKey)
	}
	return nil
}

const testBootstrapTF = `
variable "testcloud_region" {
  type = string
}

variable "testcloud_secret_key" {
  type      = string
  sensitive = true
}

resource "terraform_data" "network" {
  input = "net-${var.testcloud_region}"
  lifecycle {
    precondition {
      condition     = var.testcloud_region != "fail-1"
      error_message = "region fail-1 cannot be bootstrapped"
    }
  }
}

output "network" {
  value = terraform_data.network.output
}

output "key" {
  value     = "key-${terraform_data.network.id}"
  sensitive = true
}

output "extra" {
  value = "not a bootstrap field"
}
`

func (testStack) BootstrapTemplates(context.Context, *provider.Credential) ([]*provider.Template, error) {
	return []*provider.Template{{Files: map[string][]byte{"main.tf": []byte(testBootstrapTF)}}}, nil
}

func (testStack) ApplyTemplate(context.Context, *provider.Credential) (*provider.Template, error) {
	return nil, errors.New("testcloud makes no machines")
}

func testProviders() *provider.Registry {
	r := provider.NewRegistry()
	r.Register(&provider.Provider{
		Name: "testcloud", ResourceType: "testcloud_machine", Description: "a provider for credential tests",
		Schema: provider.Schema{
			NewCredential: func() any { return &testCred{} },
			NewBootstrap:  func() any { return &testBootstrap{} },
		},
		Stack: func(*provider.BaseStack) (provider.Stack, error) { return testStack{}, nil },
	})
	return r
}

// credWorld: alice (admin of red), bob (member of red), carol (admin of blue), and the kloud
// admin.
func newCredWorld(t *testing.T, o kloudtest.Options) *userWorld {
	t.Helper()
	if o.Providers == nil {
		o.Providers = testProviders()
	}
	w := newUserWorld(t, o)
	for _, u := range []string{"alice", "bob", "carol"} {
		w.addUser(u, "", false)
	}
	w.ok(errOf(w.client("alice").TeamCreate(w.t.Context(), api.TeamCreateParams{Slug: "red"})), "team.create")
	w.ok(errOf(w.client("alice").TeamAddMember(w.t.Context(), api.TeamMemberParams{Team: "red", Username: "bob"})), "team.addMember")
	w.ok(errOf(w.client("carol").TeamCreate(w.t.Context(), api.TeamCreateParams{Slug: "blue"})), "team.create")
	return w
}

func goodCredData() map[string]any {
	return map[string]any{"access_key": "good-key", "secret_key": testSecretKey, "token": testToken}
}

func (w *userWorld) addCred(user, title string, data map[string]any) string {
	w.t.Helper()
	var res api.CredentialAddResult
	w.ok(into(&res)(w.client(user).CredentialAdd(w.t.Context(), api.CredentialAddParams{Provider: "testcloud", Title: title, Data: json.RawMessage(mustJSON(w.t, data))})), "credential.add")
	if res.ID == "" {
		w.t.Fatal("credential.add returned no id")
	}
	return res.ID
}

func (w *userWorld) listCreds(user string, params api.CredentialListParams) []string {
	w.t.Helper()
	var res api.CredentialListResult
	w.ok(into(&res)(w.client(user).CredentialList(w.t.Context(), params)), "credential.list")
	var ids []string
	for _, c := range res.Credentials {
		ids = append(ids, c.ID)
		if c.Public != nil {
			w.t.Errorf("credential.list shows fields: %+v", c)
		}
	}
	return ids
}

func TestCredentialAuthz(t *testing.T) {
	t.Parallel()
	w := newCredWorld(t, kloudtest.Options{})
	id := w.addCred("alice", "alice's key", goodCredData())

	callers := []string{"alice", "bob", "carol", kloud.Admin} // owner, same-team member, other team, kloud admin
	ok := error(nil)
	table := []struct {
		method string
		params func() any
		want   []error // per caller
	}{
		{"credential.describe", func() any { return api.CredentialRef{CredentialID: id} },
			[]error{ok, ok, kite.ErrNotFound, ok}},
		{"credential.authenticate", func() any { return api.CredentialRef{CredentialID: id} },
			[]error{ok, ok, kite.ErrNotFound, ok}},
		// Without a terraformer, callers allowed to bootstrap get "bad state": they got past authz.
		{"credential.bootstrap", func() any { return api.CredentialBootstrapParams{CredentialID: id} },
			[]error{kite.ErrState, kite.ErrPermission, kite.ErrNotFound, kite.ErrState}},
		{"credential.bootstrap", func() any { return api.CredentialBootstrapParams{CredentialID: id, Destroy: true} },
			[]error{kite.ErrState, kite.ErrPermission, kite.ErrNotFound, kite.ErrState}},
		{"credential.remove", func() any { return api.CredentialRef{CredentialID: w.addCred("alice", "to remove", goodCredData())} },
			[]error{ok, kite.ErrPermission, kite.ErrNotFound, ok}},
		{"credential.add", func() any {
			return api.CredentialAddParams{Provider: "testcloud", Title: "added", Team: "red", Data: json.RawMessage(mustJSON(w.t, goodCredData()))}
		}, []error{ok, ok, kite.ErrPermission, ok}},
		{"credential.list", func() any { return api.CredentialListParams{Team: "red"} },
			[]error{ok, ok, kite.ErrNotFound, ok}},
	}
	for _, row := range table {
		for i, user := range callers {
			err := w.call(user, row.method, row.params(), nil)
			if row.want[i] == nil && err != nil || row.want[i] != nil && !errors.Is(err, row.want[i]) {
				t.Errorf("%s as %s: got %v, want %v", row.method, user, err, row.want[i])
			}
		}
	}
	// Nobody sees another team's credentials; admins see every team's.
	for user, want := range map[string]bool{"alice": true, "bob": true, "carol": false, kloud.Admin: true} {
		if got := slices.Contains(w.listCreds(user, api.CredentialListParams{}), id); got != want {
			t.Errorf("credential.list as %s lists alice's credential: %v", user, got)
		}
	}
	blue := w.addCred("carol", "carol's key", goodCredData())
	if got := w.listCreds("alice", api.CredentialListParams{}); slices.Contains(got, blue) {
		t.Errorf("alice lists carol's credential")
	}
	if _, _, err := w.e.Server.CredentialFor(t.Context(), "alice", blue, "testcloud"); !errors.Is(err, kite.ErrNotFound) {
		t.Errorf("credentialFor of another team's credential: %v", err)
	}
	// A member removes their own credential; a team admin removes a member's.
	mine := w.addCred("bob", "bob's", goodCredData())
	w.ok(errOf(w.client("bob").CredentialRemove(w.t.Context(), api.CredentialRef{CredentialID: mine})), "credential.remove")
	bobs := w.addCred("bob", "bob's too", goodCredData())
	w.ok(errOf(w.client("alice").CredentialRemove(w.t.Context(), api.CredentialRef{CredentialID: bobs})), "credential.remove")
	wantErr(t, errOf(w.client("bob").CredentialDescribe(w.t.Context(), api.CredentialRef{CredentialID: bobs})), kite.ErrNotFound, "describe a removed credential")

	w.scan(testSecretKey, testToken)
}

func TestCredentialValuesAndSecrets(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// The scan below reads what the store keeps on disk: the embedded store, in dir.
	w := newCredWorld(t, kloudtest.Options{DataDir: dir, EmbeddedStore: true})
	id := w.addCred("alice", "alice's key", goodCredData())

	// Decoding is strict, fills defaults, checks required fields and Valid, and keeps secrets
	// out of its errors.
	for name, c := range map[string]struct {
		data map[string]any
		want string
	}{
		"missing secret": {map[string]any{"access_key": "k"}, "secret_key"},
		"unknown field":  {map[string]any{"access_key": "k", "secret_key": testSecretKey, "colour": "red"}, "colour"},
		"wrong type":     {map[string]any{"access_key": "k", "secret_key": testSecretKey, "port": "many"}, "port"},
		"Valid fails":    {map[string]any{"access_key": "k", "secret_key": testSecretKey, "region": "nowhere"}, "[secret]"},
	} {
		_, err := w.client("alice").CredentialAdd(w.t.Context(), api.CredentialAddParams{Provider: "testcloud", Title: name, Data: json.RawMessage(mustJSON(w.t, c.data))})
		if !errors.Is(err, kite.ErrInvalidParams) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want invalid params mentioning %q", name, err, c.want)
		}
	}
	_, err := w.client("alice").CredentialAdd(w.t.Context(), api.CredentialAddParams{Provider: "nocloud", Title: "x"})
	if !errors.Is(err, kite.ErrInvalidParams) || !strings.Contains(err.Error(), "testcloud") {
		t.Errorf("unknown provider: %v", err)
	}
	wantErr(t, errOf(w.client("alice").CredentialAdd(w.t.Context(), api.CredentialAddParams{Provider: "testcloud", Data: json.RawMessage(mustJSON(w.t, goodCredData()))})), kite.ErrInvalidParams, "no title")
	// The admin is in one team (default), so the team may be omitted; in two, it may not.
	w.ok(errOf(w.client(kloud.Admin).TeamAddMember(w.t.Context(), api.TeamMemberParams{Team: "blue", Username: "alice"})), "team.addMember")
	_, err = w.client("alice").CredentialAdd(w.t.Context(), api.CredentialAddParams{Provider: "testcloud", Title: "which team?", Data: json.RawMessage(mustJSON(w.t, goodCredData()))})
	if !errors.Is(err, kite.ErrInvalidParams) || !strings.Contains(err.Error(), "blue, red") {
		t.Errorf("no team while in two: %v", err)
	}
	w.ok(errOf(w.client("carol").TeamRemoveMember(w.t.Context(), api.TeamMemberParams{Team: "blue", Username: "alice"})), "team.removeMember")

	var d api.CredentialView
	w.ok(into(&d)(w.client("bob").CredentialDescribe(w.t.Context(), api.CredentialRef{CredentialID: id})), "credential.describe")
	if d.Provider != "testcloud" || d.Team != "red" || d.Owner != "alice" || d.Verified || d.Bootstrap == nil || d.Bootstrap.Status != model.BootstrapNone {
		t.Fatalf("describe: %+v", d)
	}
	fields := map[string]api.CredentialField{}
	for _, f := range d.Fields {
		fields[f.Name] = f
	}
	for name, want := range map[string]api.CredentialField{
		"region":     {Field: provider.Field{Name: "region", Type: "string", Label: "Region", Default: "eu-1"}, Set: true, Value: "eu-1"},
		"access_key": {Field: provider.Field{Name: "access_key", Type: "string", Label: "Access key", Required: true}, Set: true, Value: "good-key"},
		"secret_key": {Field: provider.Field{Name: "secret_key", Type: "string", Label: "Secret key", Secret: true, Required: true}, Set: true},
		"token":      {Field: provider.Field{Name: "token", Type: "string", Label: "Session token", Secret: true}, Set: true},
		"port":       {Field: provider.Field{Name: "port", Type: "integer", Label: "Port", Default: "443"}, Set: true, Value: float64(443)},
	} {
		if got := fields[name]; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("field %s: %+v, want %+v", name, got, want)
		}
	}
	if !slices.Equal(d.Secret, []string{"secret_key", "token"}) {
		t.Errorf("secretFields %v", d.Secret)
	}

	// Authenticate: the provider decides; failures are stored, redacted.
	var auth api.AuthenticateResult
	w.ok(into(&auth)(w.client("bob").CredentialAuthenticate(w.t.Context(), api.CredentialRef{CredentialID: id})), "credential.authenticate")
	if !auth.Verified || auth.Error != "" {
		t.Fatalf("authenticate a good credential: %+v", auth)
	}
	bad := w.addCred("alice", "bad key", map[string]any{"access_key": "bad-key", "secret_key": testSecretKey})
	w.ok(into(&auth)(w.client("alice").CredentialAuthenticate(w.t.Context(), api.CredentialRef{CredentialID: bad})), "credential.authenticate")
	if auth.Verified || !strings.Contains(auth.Error, "bad-key rejected") || !strings.Contains(auth.Error, "[secret]") {
		t.Fatalf("authenticate a bad credential: %+v", auth)
	}
	d = api.CredentialView{}
	w.ok(into(&d)(w.client("alice").CredentialDescribe(w.t.Context(), api.CredentialRef{CredentialID: bad})), "credential.describe")
	if d.Verified || d.VerifyErr != auth.Error {
		t.Fatalf("stored verification: %+v", d)
	}
	d = api.CredentialView{}
	w.ok(into(&d)(w.client("alice").CredentialDescribe(w.t.Context(), api.CredentialRef{CredentialID: id})), "credential.describe")
	if !d.Verified {
		t.Fatal("verified credential not marked verified")
	}

	// credentialFor opens the value for the team; variables are <provider>_<field>.
	pc, secretVars, err := w.e.Server.CredentialFor(t.Context(), "bob", id, "testcloud")
	if err != nil {
		t.Fatal(err)
	}
	if v := pc.Value.(*testCred); *v != (testCred{Region: "eu-1", AccessKey: "good-key", SecretKey: testSecretKey, Token: testToken, Port: 443}) {
		t.Fatalf("opened credential: %+v", v)
	}
	if !slices.Equal(secretVars, []string{"testcloud_secret_key", "testcloud_token"}) {
		t.Fatalf("secret vars %v", secretVars)
	}
	prov, _ := testProviders().Lookup("testcloud")
	vars, _ := kloud.CredentialVariables(prov, pc)
	if fmt.Sprint(vars) != fmt.Sprint(map[string]any{"testcloud_access_key": "good-key", "testcloud_port": json.Number("443"),
		"testcloud_region": "eu-1", "testcloud_secret_key": testSecretKey, "testcloud_token": testToken}) {
		t.Fatalf("variables %v", vars)
	}
	if _, _, err := w.e.Server.CredentialFor(t.Context(), "bob", id, "othercloud"); !errors.Is(err, kite.ErrInvalidParams) {
		t.Fatalf("credentialFor with the wrong provider: %v", err)
	}

	// A live stack that uses the credential keeps it.
	if err := w.e.Server.Store().Stacks().Insert(t.Context(), model.Stack{ID: "stack-1", Team: "red", Owner: "alice", State: model.StackInitialized,
		Credentials: map[string]string{"testcloud": id}}); err != nil {
		t.Fatal(err)
	}
	_, err = w.client("alice").CredentialRemove(w.t.Context(), api.CredentialRef{CredentialID: id})
	if !errors.Is(err, kite.ErrState) || !strings.Contains(err.Error(), "stack-1") {
		t.Fatalf("remove a credential a stack uses: %v", err)
	}
	var pd api.ProviderDescribeResult
	w.ok(into(&pd)(w.client("carol").ProviderDescribe(w.t.Context(), api.ProviderDescribeParams{})), "provider.describe")
	if len(pd.Providers) != 1 || pd.Providers[0].Name != "testcloud" || len(pd.Providers[0].Credential) != 6 || !pd.Providers[0].Credential[2].Secret ||
		!pd.Providers[0].Credential[5].Immutable || !strings.Contains(string(pd.Providers[0].Schemas.Credential), `"immutable":true`) {
		t.Fatalf("provider.describe: %+v", pd)
	}
	wantErr(t, errOf(w.client("carol").ProviderDescribe(w.t.Context(), api.ProviderDescribeParams{Provider: "nocloud"})), kite.ErrNotFound, "describe an unknown provider")

	// Sealed at rest: neither the document nor any file of the data dir holds a secret.
	raw := storetest.Raw(t, w.e.Server.Store(), store.CollCredentials, id)
	if bytes.Contains(raw, []byte(testSecretKey)) || bytes.Contains(raw, []byte(testToken)) || !bytes.Contains(raw, []byte("good-key")) {
		t.Fatalf("stored credential document holds a secret (or lost its public fields): %s", raw)
	}
	w.e.Stop()
	files, public := 0, 0
	filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
		if err != nil || !de.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Errorf("read %s: %v", p, err)
			return nil
		}
		files++
		if bytes.Contains(b, []byte("good-key")) {
			public++ // the scan sees stored documents
		}
		if bytes.Contains(b, []byte(testSecretKey)) || bytes.Contains(b, []byte(testToken)) {
			t.Errorf("%s holds a secret in plain text", p)
		}
		return nil
	})
	if files < 3 || public == 0 {
		t.Fatalf("scanned %d files in %s, %d with the credential's public fields", files, dir, public)
	}
	w.scan(testSecretKey, testToken)
}

// watchJob follows a job through job.watch as user and returns the events.
func (w *userWorld) watchJob(user, jobID string) []api.JobEvent {
	w.t.Helper()
	c := w.as(user)
	var res struct {
		Subscription string `json:"subscription"`
	}
	if err := c.Call(w.t.Context(), "job.watch", api.JobRef{JobID: jobID}, &res); err != nil {
		w.t.Fatal(err)
	}
	sub := c.Subscribe(res.Subscription)
	defer sub.Close()
	ctx, cancel := context.WithTimeout(w.t.Context(), 3*time.Minute)
	defer cancel()
	var evs []api.JobEvent
	for {
		ev, err := sub.Next(ctx)
		if err != nil {
			if !errors.Is(err, kite.ErrStreamEnded) {
				w.t.Fatalf("job.watch: %v", err)
			}
			return evs
		}
		w.record(ev.Data)
		var je api.JobEvent
		if err := json.Unmarshal(ev.Data, &je); err != nil {
			w.t.Fatal(err)
		}
		evs = append(evs, je)
		if je.Status.Done() {
			return evs
		}
	}
}

func (w *userWorld) job(user, id string) api.Job {
	w.t.Helper()
	var j api.Job
	w.ok(into(&j)(w.client(user).JobGet(w.t.Context(), api.JobRef{JobID: id})), "job.get")
	return j
}

func TestCredentialBootstrap(t *testing.T) {
	t.Parallel()
	tf := terraformertest.Start(t, terraformertest.Options{})
	w := newCredWorld(t, kloudtest.Options{Terraformer: tf.Client})
	id := w.addCred("alice", "alice's key", goodCredData())

	var br api.BootstrapResult
	w.ok(into(&br)(w.client("alice").CredentialBootstrap(w.t.Context(), api.CredentialBootstrapParams{CredentialID: id})), "credential.bootstrap")
	if br.JobID == "" || br.Status != model.BootstrapRunning {
		t.Fatalf("bootstrap: %+v", br)
	}
	wantErr(t, errOf(w.client("bob").CredentialBootstrap(w.t.Context(), api.CredentialBootstrapParams{CredentialID: id})), kite.ErrPermission, "member bootstraps")
	evs := w.watchJob("alice", br.JobID)
	last, logLines := -1, 0
	for _, ev := range evs {
		if ev.Percentage < last {
			t.Errorf("progress went back: %d after %d", ev.Percentage, last)
		}
		last = ev.Percentage
		logLines += len(ev.Log)
	}
	final := evs[len(evs)-1]
	if final.Status != api.JobSucceeded || final.Percentage != 100 || logLines == 0 {
		t.Fatalf("bootstrap job ended %+v after %d events, %d log lines", final, len(evs), logLines)
	}
	var d api.CredentialView
	w.ok(into(&d)(w.client("bob").CredentialDescribe(w.t.Context(), api.CredentialRef{CredentialID: id})), "credential.describe")
	b := d.Bootstrap
	if b.Status != model.BootstrapDone || !slices.Equal(b.Outputs, []string{"key", "network"}) || b.JobID != br.JobID ||
		!slices.Equal(b.ContentIDs, []string{"bootstrap-red-" + id + "-0"}) {
		t.Fatalf("bootstrap state: %+v", b)
	}
	pc, secretVars, err := w.e.Server.CredentialFor(t.Context(), "bob", id, "testcloud")
	if err != nil {
		t.Fatal(err)
	}
	boot := pc.Bootstrap.(*testBootstrap)
	if boot.Network != "net-eu-1" || !strings.HasPrefix(boot.Key, "key-") {
		t.Fatalf("bootstrap outputs: %+v", boot)
	}
	if !slices.Equal(secretVars, []string{"testcloud_key", "testcloud_secret_key", "testcloud_token"}) {
		t.Fatalf("secret vars with bootstrap: %v", secretVars)
	}
	// Once per credential: a second call answers with the first job.
	w.ok(into(&br)(w.client("alice").CredentialBootstrap(w.t.Context(), api.CredentialBootstrapParams{CredentialID: id})), "credential.bootstrap")
	if !br.AlreadyDone || br.JobID != d.Bootstrap.JobID {
		t.Fatalf("second bootstrap: %+v", br)
	}
	_, err = w.client("alice").CredentialRemove(w.t.Context(), api.CredentialRef{CredentialID: id})
	if !errors.Is(err, kite.ErrState) || !strings.Contains(err.Error(), "--destroy") {
		t.Fatalf("remove a bootstrapped credential: %v", err)
	}

	// A failing bootstrap: the job fails with Terraform's message; the state says so.
	failing := w.addCred("alice", "fails", map[string]any{"access_key": "good-key", "secret_key": testSecretKey, "region": "fail-1"})
	w.ok(into(&br)(w.client("alice").CredentialBootstrap(w.t.Context(), api.CredentialBootstrapParams{CredentialID: failing})), "credential.bootstrap")
	evs = w.watchJob("alice", br.JobID)
	if j := w.job("alice", br.JobID); j.Status != api.JobFailed || !strings.Contains(j.Error, "region fail-1 cannot be bootstrapped") {
		t.Fatalf("failing bootstrap job: %+v", j)
	}
	d = api.CredentialView{}
	w.ok(into(&d)(w.client("alice").CredentialDescribe(w.t.Context(), api.CredentialRef{CredentialID: failing})), "credential.describe")
	if d.Bootstrap.Status != model.BootstrapFailed || !strings.Contains(d.Bootstrap.Error, "fail-1") {
		t.Fatalf("failed bootstrap state: %+v", d.Bootstrap)
	}

	// Destroy tears down what was applied (also after a failure), then the credential can go.
	for _, cid := range []string{id, failing} {
		w.ok(into(&br)(w.client("alice").CredentialBootstrap(w.t.Context(), api.CredentialBootstrapParams{CredentialID: cid, Destroy: true})), "credential.bootstrap")
		if br.Status != model.BootstrapDestroying {
			t.Fatalf("destroy: %+v", br)
		}
		w.watchJob("alice", br.JobID)
		if j := w.job("alice", br.JobID); j.Status != api.JobSucceeded {
			t.Fatalf("destroy job: %+v", j)
		}
		d = api.CredentialView{}
		w.ok(into(&d)(w.client("alice").CredentialDescribe(w.t.Context(), api.CredentialRef{CredentialID: cid})), "credential.describe")
		if d.Bootstrap.Status != model.BootstrapDestroyed || len(d.Bootstrap.ContentIDs) != 0 || len(d.Bootstrap.Outputs) != 0 {
			t.Fatalf("destroyed bootstrap state: %+v", d.Bootstrap)
		}
		wantErr(t, errOf(w.client("alice").CredentialBootstrap(w.t.Context(), api.CredentialBootstrapParams{CredentialID: cid, Destroy: true})), kite.ErrState, "destroy twice")
		w.ok(errOf(w.client("alice").CredentialRemove(w.t.Context(), api.CredentialRef{CredentialID: cid})), "credential.remove")
	}
	w.scan(testSecretKey, testToken, boot.Key)
}

// TestCredentialBootstrapRecovers: a bootstrap job whose kloud died is resumed by the next
// kloud, which re-attaches to the Terraform run that went on in terraformer; without a
// terraformer it fails honestly.
func TestCredentialBootstrapRecovers(t *testing.T) {
	t.Parallel()
	tf := terraformertest.Start(t, terraformertest.Options{})
	dir := t.TempDir()
	// The test opens kloud's store itself, between kloud's runs: the embedded one, in dir.
	w := newCredWorld(t, kloudtest.Options{DataDir: dir, EmbeddedStore: true})
	id := w.addCred("alice", "alice's key", goodCredData())
	other := w.addCred("alice", "no terraformer", goodCredData())
	w.e.Stop()

	// What a kloud that died mid-bootstrap leaves behind: the terraform run it started, a
	// running job whose runner lease ran out, and the credential's claim.
	ctx := t.Context()
	cid := "bootstrap-red-" + id + "-0"
	tfJob, err := tf.Client.Apply(ctx, tfapi.Request{ContentID: cid, Files: map[string]string{"main.tf": testBootstrapTF},
		Variables: map[string]any{"testcloud_region": "eu-1", "testcloud_secret_key": testSecretKey}})
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(ctx, store.Options{DataDir: dir, Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	orphan := func(credID string, tfJobs []string) string {
		jid, err := st.Jobs().Create(ctx, store.Job{Kind: "credential.bootstrap", Target: "credential/" + credID, Owner: "alice"})
		if err != nil {
			t.Fatal(err)
		}
		// Its params as a kloud before typed job params wrote them (a map): it resumes all the same.
		storetest.SetFields(t, st, store.CollJobs, jid, map[string]any{"params": map[string]any{"credential": credID, "destroy": false}})
		if _, err := st.Jobs().Start(ctx, jid, "a-dead-kloud"); err != nil {
			t.Fatal(err)
		}
		past := time.Now().Add(-time.Hour)
		storetest.SetFields(t, st, store.CollJobs, jid, map[string]any{"leaseUntil": past})
		storetest.SetFields(t, st, store.CollCredentials, credID, map[string]any{
			"bootstrap.status": model.BootstrapRunning, "bootstrap.jobId": jid, "bootstrap.tfJobs": tfJobs,
			"bootstrap.contentIds": []string{"bootstrap-red-" + credID + "-0"}})
		return jid
	}
	jid := orphan(id, []string{tfJob})
	st.Close(ctx)

	w2 := newUserWorld(t, kloudtest.Options{DataDir: dir, EmbeddedStore: true, Providers: testProviders(), Terraformer: tf.Client})
	var j api.Job
	testutil.Eventually(t, 3*time.Minute, func() bool {
		j = w2.job("alice", jid)
		return j.Status.Done()
	}, "recovered bootstrap job %s did not finish", jid)
	if j.Status != api.JobSucceeded || j.Attempt != 2 || !slices.ContainsFunc(j.Log, func(l string) bool { return strings.Contains(l, "re-attaching to terraform job "+tfJob) }) {
		t.Fatalf("recovered job: %+v", j)
	}
	var d api.CredentialView
	w2.ok(into(&d)(w2.client("alice").CredentialDescribe(w2.t.Context(), api.CredentialRef{CredentialID: id})), "credential.describe")
	if d.Bootstrap.Status != model.BootstrapDone || !slices.Equal(d.Bootstrap.Outputs, []string{"key", "network"}) {
		t.Fatalf("recovered bootstrap state: %+v", d.Bootstrap)
	}
	pc, _, err := w2.e.Server.CredentialFor(ctx, "alice", id, "testcloud")
	if err != nil {
		t.Fatal(err)
	}
	w2.e.Stop()

	// Without a terraformer to re-attach to, the job fails with a reason and frees the claim.
	st, err = store.Open(ctx, store.Options{DataDir: dir, Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	jid = orphan(other, nil)
	st.Close(ctx)
	w3 := newUserWorld(t, kloudtest.Options{DataDir: dir, EmbeddedStore: true, Providers: testProviders()})
	testutil.Eventually(t, time.Minute, func() bool {
		j = w3.job("alice", jid)
		return j.Status.Done()
	}, "recovered bootstrap job %s did not finish", jid)
	if j.Status != api.JobFailed || !strings.Contains(j.Error, "kloud restarted") || !strings.Contains(j.Error, "terraformer") {
		t.Fatalf("recovered job without terraformer: %+v", j)
	}
	w3.ok(into(&d)(w3.client("alice").CredentialDescribe(w3.t.Context(), api.CredentialRef{CredentialID: other})), "credential.describe")
	if d.Bootstrap.Status != model.BootstrapFailed || d.Bootstrap.Error == "" {
		t.Fatalf("bootstrap state after a failed recovery: %+v", d.Bootstrap)
	}
	for _, x := range []*userWorld{w2, w3} {
		x.scan(testSecretKey, testToken, pc.Bootstrap.(*testBootstrap).Key)
	}
}
