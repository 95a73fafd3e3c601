package local_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/providers/local"
	"github.com/kloud-dev/kloud/providers/local/sandbox"
	"github.com/kloud-dev/kloud/providers/local/tfprovider"
	"github.com/kloud-dev/kloud/providers/local/tfprovider/tfprovidertest"
)

// newLocal is a local provider (kloud instance inst) on the test host, with its service served on
// loopback.
func newLocal(t *testing.T, h *tfprovidertest.Host, inst string) (*local.Local, string) {
	t.Helper()
	l, err := local.New(local.Options{
		StateDir: h.StateDir, BaseImage: h.BaseImage, Bridge: h.Bridge, Subnet: h.Subnet, Instance: inst,
		Endpoint: "http://127.0.0.1:1", Logger: testutil.Logger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(l.Provider().Handler)
	t.Cleanup(srv.Close)
	return l, srv.URL
}

// call sends a raw request to the service and returns the status and body.
func call(t *testing.T, method, url, token, body string) (int, string) {
	t.Helper()
	return testutil.HTTPDo(t, method, url+tfprovider.APIPath+"machines", token, body)
}

func createBody(stack, machine, hostname string) string {
	return fmt.Sprintf(`{"hostname": %q, "tags": {"kloud_stack": %q, "kloud_machine": %q, "team": "t"}}`, hostname, stack, machine)
}

// The service refuses whatever its token does not allow, and creates, reads, retags and deletes
// only its stack's machines of its own kloud instance; nothing refused creates or destroys a
// machine. Two instances on one state dir sweep only their own machines.
func TestServiceAuthorization(t *testing.T) {
	h := tfprovidertest.NewHost(t)
	la, urlA := newLocal(t, h, "kloud-a")
	lb, urlB := newLocal(t, h, "kloud-b")
	if la.Instance() != "kloud-a" {
		t.Fatalf("instance %q", la.Instance())
	}
	tokA, err := la.Token("stackA", []string{"mA"})
	if err != nil {
		t.Fatal(err)
	}
	// The key is persisted root-only in the state dir.
	st, err := os.Stat(filepath.Join(h.StateDir, local.KeyFile))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", st, err)
	}
	key, err := os.ReadFile(filepath.Join(h.StateDir, local.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	forge := func(claims jwt.MapClaims, k []byte) string {
		s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString(k)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	base := func(exp time.Time) jwt.MapClaims {
		return jwt.MapClaims{"stack": "stackA", "machines": []string{"mA"}, "instance": "kloud-a",
			"iss": "kloud-local", "aud": "kloud-local-machines/v1", "iat": time.Now().Add(-2 * time.Hour).Unix(), "exp": exp.Unix()}
	}
	expired := forge(base(time.Now().Add(-time.Hour)), key)
	otherKey := forge(base(time.Now().Add(time.Hour)), []byte("0123456789abcdef0123456789abcdef"))
	noExp := base(time.Now())
	delete(noExp, "exp")
	withoutExp := forge(noExp, key)
	none := func() string {
		s, _ := jwt.NewWithClaims(jwt.SigningMethodNone, base(time.Now().Add(time.Hour))).SignedString(jwt.UnsafeAllowNoneSignatureType)
		return s
	}()

	big := `{"hostname": "a", "userData": "` + strings.Repeat("x", 3<<20) + `", "tags": {}}`
	for _, tc := range []struct {
		name, url, token, body string
		code                   int
		says                   string
	}{
		{"no token", urlA, "", createBody("stackA", "mA", "a"), 401, "no token"},
		{"garbage token", urlA, "not-a-jwt", createBody("stackA", "mA", "a"), 401, "invalid token"},
		{"expired token", urlA, expired, createBody("stackA", "mA", "a"), 401, "token expired"},
		{"token without expiry", urlA, withoutExp, createBody("stackA", "mA", "a"), 401, "invalid token"},
		{"token of another key", urlA, otherKey, createBody("stackA", "mA", "a"), 401, "invalid token"},
		{"unsigned token", urlA, none, createBody("stackA", "mA", "a"), 401, "invalid token"},
		{"token of another instance", urlB, tokA, createBody("stackA", "mA", "a"), 403, "kloud instance"},
		{"another stack's tag", urlA, tokA, createBody("stackB", "mA", "a"), 403, "stack stackA only"},
		{"machine not in the token", urlA, tokA, createBody("stackA", "mX", "a"), 403, "not a machine of this build"},
		{"no kloud tags", urlA, tokA, `{"hostname": "a", "tags": {}}`, 403, "stack stackA only"},
		{"bad hostname", urlA, tokA, createBody("stackA", "mA", "bad_name"), 400, "hostname"},
		{"bad memory", urlA, tokA, `{"hostname": "a", "memoryMB": 8, "tags": {"kloud_stack": "stackA", "kloud_machine": "mA"}}`, 400, "memory 8"},
		{"unknown field", urlA, tokA, `{"hostname": "a", "stateDir": "/", "tags": {}}`, 400, "unknown field"},
		{"trailing data", urlA, tokA, createBody("stackA", "mA", "a") + "{}", 400, "after the JSON"},
		{"bad tag key", urlA, tokA, `{"hostname": "a", "tags": {"a b": "c", "kloud_stack": "stackA", "kloud_machine": "mA"}}`, 400, "tag"},
		{"body too big", urlA, tokA, big, 413, "over"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := call(t, "POST", tc.url, tc.token, tc.body)
			if code != tc.code || !strings.Contains(body, tc.says) || !strings.HasPrefix(body, `{"error":`) {
				t.Errorf("got %d %s, want %d saying %q", code, body, tc.code, tc.says)
			}
		})
	}
	if left, _ := h.Manager.List(t.Context()); len(left) != 0 {
		t.Fatalf("refused creates made machines: %+v", left)
	}

	// Allowed: a machine of stackA, recorded as kloud-a's.
	ca, err := tfprovider.NewClient(urlA, tokA)
	if err != nil {
		t.Fatal(err)
	}
	a0, err := ca.Create(t.Context(), tfprovider.CreateRequest{Hostname: "a0", MemoryMB: 128, Tags: map[string]string{local.TagStack: "stackA", local.TagMachine: "mA", "team": "t"}})
	if err != nil {
		t.Fatal(err)
	}
	if a0.State != "running" || a0.IPAddress == "" || a0.MemoryMB != 128 || !strings.HasPrefix(a0.ID, "a0-") {
		t.Errorf("created: %+v", a0)
	}
	if in, _ := h.Manager.Info(t.Context(), a0.ID); in.Instance != "kloud-a" || in.Tags[local.TagStack] != "stackA" {
		t.Errorf("record of the created machine: instance %q tags %v", in.Instance, in.Tags)
	}
	// Machines the token must not reach: another stack's of this instance, this stack's of
	// another instance (same state dir), and one without an instance of another stack.
	creator, err := sandbox.New(sandbox.Options{StateDir: h.StateDir, BaseImage: h.BaseImage, Bridge: h.Bridge, Subnet: h.Subnet})
	if err != nil {
		t.Fatal(err)
	}
	mk := func(id, stack, inst string) {
		t.Helper()
		if _, err := creator.Create(t.Context(), sandbox.Spec{ID: id, Instance: inst, MemoryMB: 128,
			Tags: map[string]string{local.TagStack: stack, local.TagMachine: "m-" + id}}); err != nil {
			t.Fatal(err)
		}
	}
	mk("b0", "stackB", "kloud-a")
	mk("c0", "stackA", "kloud-b")
	mk("d0", "stackD", "")
	for _, id := range []string{"b0", "c0", "d0"} {
		for _, op := range []struct{ method, path, body string }{
			{"GET", "/" + id, ""}, {"PUT", "/" + id + "/tags", `{"tags": {"kloud_stack": "stackA", "kloud_machine": "mA"}}`}, {"DELETE", "/" + id, ""},
		} {
			if code, body := rawCall(t, op.method, urlA, op.path, tokA, op.body); code != 403 {
				t.Errorf("%s %s of %s with stackA's token: %d %s, want 403", op.method, op.path, id, code, body)
			}
		}
	}
	// Through the client too: another stack's token cannot read, retag or delete a0.
	tokB, _ := la.Token("stackB", nil)
	cb, _ := tfprovider.NewClient(urlA, tokB)
	if _, err := cb.Read(t.Context(), a0.ID); err == nil || !strings.Contains(err.Error(), "403") {
		t.Errorf("read of stackA's machine with stackB's token: %v", err)
	}
	if err := cb.Delete(t.Context(), a0.ID); err == nil || !strings.Contains(err.Error(), "403") {
		t.Errorf("delete of stackA's machine with stackB's token: %v", err)
	}
	if _, err := cb.Create(t.Context(), tfprovider.CreateRequest{Hostname: "x", Tags: map[string]string{local.TagStack: "stackB", local.TagMachine: "m-b0"}}); err == nil || !strings.Contains(err.Error(), "403") {
		t.Errorf("create with a token that lists no machines: %v", err)
	}
	// Retagging may not move a machine out of its stack.
	if _, err := ca.SetTags(t.Context(), a0.ID, map[string]string{local.TagStack: "stackB", local.TagMachine: "mA"}); err == nil || !strings.Contains(err.Error(), "403") {
		t.Errorf("retag into another stack: %v", err)
	}
	infos, _ := h.Manager.List(t.Context())
	if ids := ids(infos); !slices.Equal(ids, []string{a0.ID, "b0", "c0", "d0"}) {
		t.Fatalf("machines after the refusals: %v", ids)
	}
	for _, in := range infos {
		if in.State != sandbox.StateRunning {
			t.Errorf("machine %s is %s after the refusals", in.ID, in.State)
		}
	}

	// What the token allows.
	got, err := ca.Read(t.Context(), a0.ID)
	if err != nil || got.ID != a0.ID || !maps.Equal(got.Tags, map[string]string{local.TagStack: "stackA", local.TagMachine: "mA", "team": "t"}) {
		t.Errorf("read: %+v %v", got, err)
	}
	if got, err = ca.SetTags(t.Context(), a0.ID, map[string]string{local.TagStack: "stackA", local.TagMachine: "mA", "team": "u"}); err != nil || got.Tags["team"] != "u" {
		t.Errorf("retag: %+v %v", got, err)
	}
	if in, _ := h.Manager.Info(t.Context(), a0.ID); in.Instance != "kloud-a" {
		t.Errorf("retag changed the instance: %q", in.Instance)
	}
	if _, err := ca.Read(t.Context(), "nosuch"); !errors.Is(err, tfprovider.ErrNotFound) {
		t.Errorf("read of an absent machine: %v", err)
	}
	if code, body := rawCall(t, "GET", urlA, "/../../etc", tokA, ""); code == 200 {
		t.Errorf("path outside the API: %d %s", code, body)
	}
	// An expired token of the stack still reads and destroys its machines (terraform destroy
	// reuses the last build's token, maybe days later), but creates and retags nothing; an
	// expired token signed by another key is nothing.
	if code, body := rawCall(t, "PUT", urlA, "/"+a0.ID+"/tags", expired, `{"tags": {"kloud_stack": "stackA", "kloud_machine": "mA"}}`); code != 401 {
		t.Errorf("retag with an expired token: %d %s, want 401", code, body)
	}
	if code, body := rawCall(t, "GET", urlA, "/"+a0.ID, expired, ""); code != 200 {
		t.Errorf("read with an expired token of the stack: %d %s, want 200", code, body)
	}
	expiredOther := forge(base(time.Now().Add(-time.Hour)), []byte("0123456789abcdef0123456789abcdef"))
	if code, body := rawCall(t, "DELETE", urlA, "/"+a0.ID, expiredOther, ""); code != 401 {
		t.Errorf("delete with an expired token of another key: %d %s, want 401", code, body)
	}
	if code, body := rawCall(t, "DELETE", urlA, "/b0", expired, ""); code != 403 {
		t.Errorf("delete of another stack's machine with an expired token: %d %s, want 403", code, body)
	}
	if code, body := rawCall(t, "DELETE", urlA, "/"+a0.ID, expired, ""); code/100 != 2 {
		t.Fatalf("delete with an expired token of the stack: %d %s", code, body)
	}
	if in, _ := h.Manager.Info(t.Context(), a0.ID); in.State != sandbox.StateAbsent {
		t.Fatalf("a0 after its delete: %s", in.State)
	}
	if err := ca.Delete(t.Context(), a0.ID); err != nil {
		t.Errorf("second delete: %v", err)
	}

	// Two klouds on one state dir: each sweep removes only its own instance's machines, even when
	// it knows none of the stacks; the machine without an instance stays (its stack is unknown).
	gone, err := lb.GC(t.Context(), func(string, string) bool { return false })
	if err != nil || !slices.Equal(gone, []string{"c0"}) {
		t.Errorf("kloud-b's sweep removed %v (%v), want [c0]", gone, err)
	}
	gone, err = la.GC(t.Context(), func(string, string) bool { return false })
	if err != nil || !slices.Equal(gone, []string{"b0"}) {
		t.Errorf("kloud-a's sweep removed %v (%v), want [b0]", gone, err)
	}
	// A machine without an instance whose stack this kloud knows is adopted, not removed.
	if _, err := la.GC(t.Context(), func(s, m string) bool { return s == "stackD" }); err != nil {
		t.Error(err)
	}
	if in, _ := h.Manager.Info(t.Context(), "d0"); in.State != sandbox.StateRunning || in.Instance != "kloud-a" {
		t.Errorf("d0 after kloud-a's sweep that knows its stack: %s, instance %q", in.State, in.Instance)
	}
	if gone, _ := lb.GC(t.Context(), func(string, string) bool { return false }); len(gone) != 0 {
		t.Errorf("kloud-b's sweep removed kloud-a's adopted machine: %v", gone)
	}
}

func rawCall(t *testing.T, method, url, path, token, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), method, url+tfprovider.APIPath+"machines"+path, bytes.NewReader([]byte(body)))
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func ids(infos []sandbox.Info) []string {
	var out []string
	for _, in := range infos {
		out = append(out, in.ID)
	}
	slices.Sort(out)
	return out
}
