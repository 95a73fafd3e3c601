package kloud_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/kloud/store/storetest"
	"github.com/kloud-dev/kloud/providers/dummy"
)

// host is what a hostile template aims at on the host that runs Terraform: a marker file it
// would write, a secret it would read (a FIFO: opening it for reading is noticed), a module
// directory of host code, and an HTTP server it would call. check proves none was touched.
type host struct {
	t      *testing.T
	dir    string
	marker string
	secret string
	module string
	url    string
	opened atomic.Bool
	// releasing is set when the test itself opens the FIFO to let the waiting writer go.
	releasing atomic.Bool
	hits      atomic.Int32
}

func newHost(t *testing.T) *host {
	t.Helper()
	h := &host{t: t, dir: t.TempDir()}
	h.marker = filepath.Join(h.dir, "pwned-by-template.txt")
	h.secret = filepath.Join(h.dir, "secret")
	if err := syscall.Mkfifo(h.secret, 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Blocks until someone opens the FIFO for reading.
		f, err := os.OpenFile(h.secret, os.O_WRONLY, 0)
		if err != nil {
			return
		}
		if !h.releasing.Load() {
			h.opened.Store(true)
			f.WriteString("the-host-secret\n")
		}
		f.Close()
	}()
	t.Cleanup(func() {
		h.releasing.Store(true)
		if f, err := os.OpenFile(h.secret, os.O_RDONLY|syscall.O_NONBLOCK, 0); err == nil {
			<-done
			f.Close()
		}
	})
	h.module = filepath.Join(h.dir, "module")
	os.Mkdir(h.module, 0o755)
	os.WriteFile(filepath.Join(h.module, "main.tf"), []byte(fmt.Sprintf(`resource "terraform_data" "m" {
  provisioner "local-exec" { command = "id > %s" }
}
`, h.marker)), 0o644)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.hits.Add(1)
		fmt.Fprintln(w, `{"secret": "from-the-host-network"}`)
	}))
	t.Cleanup(srv.Close)
	h.url = srv.URL
	return h
}

// check fails the test if the template reached the host.
func (h *host) check(when string) {
	h.t.Helper()
	if _, err := os.Stat(h.marker); err == nil {
		b, _ := os.ReadFile(h.marker)
		h.t.Errorf("%s: the template wrote %s on the host: %q", when, h.marker, b)
	}
	if h.opened.Load() {
		h.t.Errorf("%s: the template read %s on the host", when, h.secret)
	}
	if n := h.hits.Load(); n > 0 {
		h.t.Errorf("%s: the template called the host's network (%d requests)", when, n)
	}
}

// hostileTemplates: one per construct class of issue 9, each with the rule that refuses it
// and the place (file:line:col) it must name.
func hostileTemplates(h *host) []struct{ name, main, rule, pos string } {
	return []struct{ name, main, rule, pos string }{
		{"local-exec provisioner", fmt.Sprintf(`resource "terraform_data" "x" {
  provisioner "local-exec" { command = "id > %s" }
}
resource "terraform_data" "vm" {
  input = "echo hi"
}
`, h.marker), "provisioner", "main.tf:2:3"},
		{"file() into user data", fmt.Sprintf(`resource "terraform_data" "vm" {
  input = "echo ${file(%q)}"
}
`, h.secret), "host-function", "main.tf:2:19"},
		{"local_file resource", fmt.Sprintf(`resource "local_file" "x" {
  filename = %q
  content  = "pwned"
}
`, h.marker), "provider", "main.tf:1:10"},
		{"http data source", fmt.Sprintf(`data "http" "x" {
  url = %q
}
resource "terraform_data" "vm" {
  input = "echo ${data.http.x.response_body}"
}
`, h.url), "provider", "main.tf:1:6"},
		{"external data source", fmt.Sprintf(`data "external" "x" {
  program = ["sh", "-c", "id > %s; echo '{}'"]
}
`, h.marker), "provider", "main.tf:1:6"},
		{"backend local", fmt.Sprintf(`terraform {
  backend "local" {
    path = %q
  }
}
resource "terraform_data" "vm" {
  input = "echo hi"
}
`, h.marker), "backend", "main.tf:2:3"},
		{"module from the host", fmt.Sprintf(`module "m" {
  source = %q
}
`, h.module), "module", "main.tf:1:1"},
		{"terraform_remote_state", fmt.Sprintf(`data "terraform_remote_state" "x" {
  backend = "local"
  config  = { path = %q }
}
`, h.secret), "provider", "main.tf:1:6"},
	}
}

func wantPolicyRefusal(t *testing.T, when string, err error, rule, pos string) {
	t.Helper()
	if !errors.Is(err, kite.ErrInvalidParams) {
		t.Fatalf("%s: want invalid params from the template policy, got %v", when, err)
	}
	if !strings.Contains(err.Error(), "(rule "+rule+")") || !strings.Contains(err.Error(), pos+":") {
		t.Fatalf("%s: want rule %s at %s in: %v", when, rule, pos, err)
	}
}

// TestHostileTemplates: every construct class that reaches the host is refused at
// template.create, and, stored directly (as before the policy existed), at stack.plan,
// stack.create and stack.apply (before a build job); destroy of such a stack has nothing of it
// to run. Nothing happens on the host at any step.
func TestHostileTemplates(t *testing.T) {
	t.Parallel()
	f := newFlow(t, dummy.Options{})
	cred := f.credential()
	h := newHost(t)
	for _, tc := range hostileTemplates(h) {
		t.Run(tc.name, func(t *testing.T) {
			c := f.client()
			_, err := c.TemplateCreate(t.Context(), api.TemplateParams{Title: tc.name, Files: map[string]string{"main.tf": tc.main}})
			wantPolicyRefusal(t, "template.create", err, tc.rule, tc.pos)
			h.check("template.create")

			// Stored bypassing template.create.
			now := time.Now()
			tpl := model.Template{ID: store.NewID(), Title: tc.name, Team: model.DefaultTeam, Owner: "alice", Rev: 1,
				Files: []model.File{{Name: "main.tf", Content: tc.main}}, CreatedAt: now, UpdatedAt: now}
			if err := f.Server.Store().Templates().Insert(t.Context(), tpl); err != nil {
				t.Fatal(err)
			}
			params := api.StackPlanParams{TemplateID: tpl.ID, Credentials: map[string]string{"dummy": cred}}
			_, err = c.StackPlan(t.Context(), params)
			wantPolicyRefusal(t, "stack.plan", err, tc.rule, tc.pos)
			h.check("stack.plan")
			_, err = c.StackCreate(t.Context(), params)
			wantPolicyRefusal(t, "stack.create", err, tc.rule, tc.pos)
			h.check("stack.create")

			// A stack stored with the template's files, as an older kloud made them.
			st := model.Stack{ID: store.NewID(), Title: tc.name, Team: model.DefaultTeam, Owner: "alice", TemplateID: tpl.ID, TemplateRev: 1,
				Files: tpl.Files, Credentials: map[string]string{"dummy": cred}, State: model.StackNotInitialized, Machines: []string{}, CreatedAt: now, UpdatedAt: now}
			if err := f.Server.Store().Stacks().Insert(t.Context(), st); err != nil {
				t.Fatal(err)
			}
			// stack.apply refuses it before a build job starts: the stack stays as it was (not
			// Failed because of a rule kloud could check before).
			_, err = c.StackApply(t.Context(), api.StackApplyParams{StackID: st.ID})
			wantPolicyRefusal(t, "stack.apply", err, tc.rule, tc.pos)
			h.check("build")
			got, err := f.Server.Store().Stacks().Get(t.Context(), st.ID)
			if err != nil {
				t.Fatal(err)
			}
			if got.State != model.StackNotInitialized || got.JobID != "" {
				t.Fatalf("stack after the refused build: %s %q (job %q)", got.State, got.Reason, got.JobID)
			}
			// Destroy runs only what terraform applied, and the template never got there.
			if last := f.follow(f.apply(st.ID, true)); last.Status != api.JobSucceeded {
				t.Fatalf("destroy: %+v", last)
			}
			h.check("destroy")
		})
	}
}

// TestTrustedTemplate: an administrator's trust lifts exactly the rules named, for exactly
// the revision trusted; members cannot trust; a new revision is not trusted.
func TestTrustedTemplate(t *testing.T) {
	t.Parallel()
	f := newFlow(t, dummy.Options{})
	admin := f.Client(kloud.Admin)
	c := f.client()
	// The provisioner writes nowhere: this test is about which rules are enforced.
	both := `resource "terraform_data" "vm" {
  input = "echo ${file("/etc/hostname")}"
  provisioner "local-exec" { command = "true" }
}
`
	onlyProv := `resource "terraform_data" "vm" {
  input = "echo hi"
  provisioner "local-exec" { command = "true" }
}
`
	tpl, err := c.TemplateCreate(t.Context(), api.TemplateParams{Title: "fine", Files: map[string]string{"main.tf": "resource \"terraform_data\" \"vm\" {\n  input = \"echo hi\"\n}\n"}})
	if err != nil {
		t.Fatal(err)
	}
	// Stored before the policy: rev 2 has a provisioner.
	storetest.SetFields(t, f.Server.Store(), store.CollTemplates, tpl.ID, map[string]any{"rev": 2, "files": []model.File{{Name: "main.tf", Content: onlyProv}}})
	cred := f.credential()
	plan := api.StackPlanParams{TemplateID: tpl.ID, Credentials: map[string]string{"dummy": cred}}
	wantPolicyRefusal(t, "plan before trust", errOf(c.StackPlan(t.Context(), plan)), "provisioner", "main.tf:3:3")

	trust := api.TrustParams{TemplateID: tpl.ID, Rules: []string{"provisioner"}, Reason: "reviewed: runs true"}
	if _, err := c.TemplateTrust(t.Context(), trust); !errors.Is(err, kite.ErrPermission) {
		t.Fatalf("a member trusted a template: %v", err)
	}
	if _, err := admin.TemplateTrust(t.Context(), api.TrustParams{TemplateID: tpl.ID, Rules: []string{"provisioner"}}); !errors.Is(err, kite.ErrInvalidParams) {
		t.Fatalf("trust without a reason: %v", err)
	}
	tr, err := admin.TemplateTrust(t.Context(), trust)
	if err != nil {
		t.Fatal(err)
	}
	if tr.Rev != 2 || tr.By != kloud.Admin || tr.Reason != "reviewed: runs true" || len(tr.Rules) != 1 {
		t.Fatalf("trust record %+v", tr)
	}
	view, err := c.TemplateGet(t.Context(), api.TemplateGetParams{TemplateID: tpl.ID})
	if err != nil {
		t.Fatal(err)
	}
	if len(view.Trust) != 1 || view.Trust[0].By != kloud.Admin {
		t.Fatalf("template.get does not show the trust: %+v", view.Trust)
	}
	// The provisioner rule is lifted for these files.
	if _, err := c.StackPlan(t.Context(), plan); err != nil {
		t.Fatalf("trusted template refused: %v", err)
	}

	// A new revision (adding file()) is not trusted: the provisioner is refused again, and
	// host-function, which was never lifted, too.
	_, err = c.TemplateUpdate(t.Context(), api.TemplateParams{TemplateID: tpl.ID, Files: map[string]string{"main.tf": both}})
	wantPolicyRefusal(t, "update", err, "provisioner", "main.tf:3:3")
	wantPolicyRefusal(t, "update", err, "host-function", "main.tf:2:19")

	// An administrator creating it with the provisioner rule lifted: file() is still refused.
	_, err = admin.TemplateCreate(t.Context(), api.TemplateParams{Title: "both", Files: map[string]string{"main.tf": both},
		Trust: &api.TrustSpec{Rules: []string{"provisioner"}, Reason: "test"}})
	wantPolicyRefusal(t, "admin create", err, "host-function", "main.tf:2:19")
	if strings.Contains(err.Error(), "rule provisioner") {
		t.Fatalf("provisioner not lifted: %v", err)
	}
	// A member cannot create with trust.
	_, err = c.TemplateCreate(t.Context(), api.TemplateParams{Title: "p", Files: map[string]string{"main.tf": onlyProv},
		Trust: &api.TrustSpec{Rules: []string{"provisioner"}, Reason: "me"}})
	if !errors.Is(err, kite.ErrPermission) {
		t.Fatalf("member create with trust: %v", err)
	}

	// Untrusted again: refused.
	if _, err := admin.TemplateUntrust(t.Context(), api.TrustParams{TemplateID: tpl.ID}); err != nil {
		t.Fatal(err)
	}
	wantPolicyRefusal(t, "plan after untrust", errOf(c.StackPlan(t.Context(), plan)), "provisioner", "main.tf:3:3")
}

// TestDestroyObeysPolicy: a stack built before the policy existed whose files now break it is
// not destroyed (terraform destroy would evaluate them: a destroy-time provisioner runs) until an
// administrator trusts those files; then it is.
func TestDestroyObeysPolicy(t *testing.T) {
	t.Parallel()
	f := newFlow(t, dummy.Options{})
	f.credential()
	h := newHost(t)
	sid, _ := f.stack(f.template("resource \"terraform_data\" \"vm\" {\n  input = \"echo hi\"\n}\n"))
	if last := f.follow(f.apply(sid, false)); last.Status != api.JobSucceeded {
		t.Fatalf("build: %+v", last)
	}
	// As an older kloud stored it: the stack's files have a destroy-time provisioner.
	hostile := fmt.Sprintf("resource \"terraform_data\" \"vm\" {\n  input = \"echo hi\"\n  provisioner \"local-exec\" {\n    when    = destroy\n    command = \"id > %s\"\n  }\n}\n", h.marker)
	storetest.SetFields(t, f.Server.Store(), store.CollStacks, sid, map[string]any{"files": []model.File{{Name: "main.tf", Content: hostile}}})
	last := f.follow(f.apply(sid, true))
	if last.Status != api.JobFailed || !strings.Contains(last.Error, "(rule provisioner)") {
		t.Fatalf("destroy of a stack whose files break the policy: %+v", last)
	}
	h.check("refused destroy")
	st, err := f.Server.Store().Stacks().Get(t.Context(), sid)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != model.StackFailed {
		t.Fatalf("stack after the refused destroy: %s", st.State)
	}

	// An administrator trusts exactly those files (a template with them, provisioner lifted):
	// the destroy goes through.
	if _, err := f.Client(kloud.Admin).TemplateCreate(t.Context(), api.TemplateParams{Title: "reviewed", Files: map[string]string{"main.tf": hostile},
		Trust: &api.TrustSpec{Rules: []string{"provisioner"}, Reason: "reviewed: destroy writes a marker"}}); err != nil {
		t.Fatal(err)
	}
	if last := f.follow(f.apply(sid, true)); last.Status != api.JobSucceeded {
		t.Fatalf("destroy after trust: %+v", last)
	}
}
