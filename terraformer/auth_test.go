package terraformer_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/terraformer"
	"github.com/kloud-dev/kloud/terraformer/terraformertest"
	"github.com/kloud-dev/kloud/terraformer/tfrun"
)

// TestAuth is the auth matrix: kloud's kite key and kloud's token are served; another user's
// valid credentials pass the handshake but every terraformer.* call gets -32002; forged, expired,
// misdirected or malformed credentials fail the handshake with -32001.
func TestAuth(t *testing.T) {
	t.Parallel()
	env := terraformertest.Start(t, terraformertest.Options{Auth: terraformer.AuthOptions{MinRefresh: time.Millisecond}})
	ctx := t.Context()
	selfID := env.Kite.Identity().ID

	// A second kontrol with its own keys: what it signs is a forgery here.
	other, err := kitekey.NewKeyring(ctx, kitekey.KeyringOptions{Store: &kitekey.FileStore{Path: filepath.Join(t.TempDir(), "keys.json")}})
	if err != nil {
		t.Fatal(err)
	}
	forger := &kitekey.Signer{Current: other.Current, Issuer: terraformertest.Issuer}
	past := &kitekey.Signer{Current: env.Keyring.Current, Issuer: terraformertest.Issuer,
		Now: func() time.Time { return time.Now().Add(-2 * time.Hour) }}
	wrongIssuer := &kitekey.Signer{Current: env.Keyring.Current, Issuer: "someone-else"}
	mint := func(f func() (string, error)) string {
		t.Helper()
		s, err := f()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	session := mint(func() (string, error) { return env.Signer.Session("kloud", false, time.Hour) })

	allowed := []struct {
		name string
		auth kite.Auth
	}{
		{"kloud-kite-key", kite.Auth{Type: kite.AuthKiteKey, Key: env.KiteKey("kloud")}},
		{"kloud-token", kite.Auth{Type: kite.AuthToken, Key: env.Token("kloud", 10*time.Minute)}},
	}
	for _, tt := range allowed {
		conn, err := env.Dial(ctx, tt.auth)
		if err != nil {
			t.Fatalf("%s: handshake: %v", tt.name, err)
		}
		// Past the permission check: the content id just does not exist.
		if err := conn.Call(ctx, terraformer.MethodOutputs, terraformer.ContentParams{ContentID: "nothing"}, nil); !errors.Is(err, kite.ErrNotFound) {
			t.Errorf("%s: outputs: %v, want -32003", tt.name, err)
		}
		conn.Close(nil)
	}

	denied := []struct {
		name string
		auth kite.Auth
	}{
		{"alice-kite-key", kite.Auth{Type: kite.AuthKiteKey, Key: env.KiteKey("alice")}},
		{"alice-token", kite.Auth{Type: kite.AuthToken, Key: env.Token("alice", 10*time.Minute)}},
		{"kloud-session", kite.Auth{Type: kite.AuthSession, Key: session}},
	}
	for _, tt := range denied {
		conn, err := env.Dial(ctx, tt.auth)
		if err != nil {
			t.Fatalf("%s: handshake: %v (a valid credential must pass the handshake)", tt.name, err)
		}
		for _, call := range []struct {
			method string
			params any
		}{
			{terraformer.MethodApply, terraformer.Request{ContentID: "x", Files: files(`resource "terraform_data" "x" {}`)}},
			{terraformer.MethodPlan, terraformer.Request{ContentID: "x"}},
			{terraformer.MethodDestroy, terraformer.Request{ContentID: "x"}},
			{terraformer.MethodJob, terraformer.JobParams{JobID: "0123456789abcdef01234567"}},
			{terraformer.MethodWatch, terraformer.JobParams{JobID: "0123456789abcdef01234567"}},
			{terraformer.MethodCancel, terraformer.JobParams{JobID: "0123456789abcdef01234567"}},
			{terraformer.MethodState, terraformer.ContentParams{ContentID: "x"}},
			{terraformer.MethodOutputs, terraformer.ContentParams{ContentID: "x"}},
			{terraformer.MethodJob, map[string]string{"bad": "params"}}, // refused before the params are looked at
		} {
			var ke *kite.Error
			if err := conn.Call(ctx, call.method, call.params, nil); !errors.As(err, &ke) || ke.Code != -32002 {
				t.Errorf("%s: %s: %v, want -32002", tt.name, call.method, err)
			}
		}
		conn.Close(nil)
	}
	if _, err := env.Engine.Job("0123456789abcdef01234567"); !errors.Is(err, tfrun.ErrNotFound) {
		t.Fatal("a denied call reached the engine")
	}

	rejected := []struct {
		name string
		auth kite.Auth
	}{
		{"forged-kite-key", kite.Auth{Type: kite.AuthKiteKey, Key: mint(func() (string, error) { return forger.KiteKey("kloud", uuid.NewString(), "http://x/kite") })}},
		{"forged-token", kite.Auth{Type: kite.AuthToken, Key: mint(func() (string, error) { return forger.Token("kloud", selfID, time.Minute) })}},
		{"expired-token", kite.Auth{Type: kite.AuthToken, Key: mint(func() (string, error) { return past.Token("kloud", selfID, time.Minute) })}},
		{"token-for-another-kite", kite.Auth{Type: kite.AuthToken, Key: env.Keys.Token("kloud", uuid.NewString(), time.Minute)}},
		{"wrong-issuer", kite.Auth{Type: kite.AuthKiteKey, Key: mint(func() (string, error) { return wrongIssuer.KiteKey("kloud", uuid.NewString(), "http://x/kite") })}},
		{"token-as-kite-key", kite.Auth{Type: kite.AuthKiteKey, Key: env.Token("kloud", time.Minute)}},
		{"tampered", kite.Auth{Type: kite.AuthKiteKey, Key: tamper(env.KiteKey("kloud"))}},
		{"garbage", kite.Auth{Type: kite.AuthKiteKey, Key: "not.a.jwt"}},
		{"unknown-type", kite.Auth{Type: "password", Key: "kloud"}},
	}
	for _, tt := range rejected {
		conn, err := env.Dial(ctx, tt.auth)
		var ke *kite.Error
		if err == nil || !errors.As(err, &ke) || ke.Code != -32001 {
			if conn != nil {
				conn.Close(nil)
			}
			t.Errorf("%s: handshake: %v, want -32001", tt.name, err)
		}
	}

	// A rotation at kloud is followed: a key signed with the new signing key verifies.
	if _, err := env.Keyring.Rotate(ctx); err != nil {
		t.Fatal(err)
	}
	fetches := env.Fetches()
	c := env.NewClient(env.KiteKeyAuth("kloud"))
	if _, err := c.Outputs(ctx, "nothing"); !errors.Is(err, kite.ErrNotFound) {
		t.Fatalf("after rotation: %v", err)
	}
	if env.Fetches() <= fetches {
		t.Error("terraformer did not fetch the keys again for the new kid")
	}
	// A client refused for permission says so clearly.
	alice := env.NewClient(env.KiteKeyAuth("alice"))
	_, err = alice.Apply(ctx, terraformer.Request{ContentID: "x", Files: files(`resource "terraform_data" "x" {}`)})
	if !errors.Is(err, kite.ErrPermission) || !strings.Contains(err.Error(), `"alice"`) {
		t.Errorf("alice's apply: %v", err)
	}
}

// tamper flips a character of the payload, keeping the JWT's shape.
func tamper(jwt string) string {
	parts := strings.Split(jwt, ".")
	p := []byte(parts[1])
	if p[5] == 'A' {
		p[5] = 'B'
	} else {
		p[5] = 'A'
	}
	parts[1] = string(p)
	return strings.Join(parts, ".")
}

// TestTokenClientRunsJobs drives a real apply over a connection authenticated with kloud's token,
// and a token client reconnecting with a fresh token.
func TestTokenClientRunsJobs(t *testing.T) {
	t.Parallel()
	env := terraformertest.Start(t, terraformertest.Options{})
	c := env.NewClient(env.TokenAuth("kloud"))
	j := run(t, c, tfrun.OpApply, terraformer.Request{ContentID: "token", Files: files(`
resource "terraform_data" "x" { input = "via token" }
output "x" { value = terraform_data.x.output }
`)}, tfrun.StatusSucceeded)
	if j.Result.Outputs["x"].Value != "via token" {
		t.Fatalf("outputs %+v", j.Result.Outputs)
	}
	env.DropConnections()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if out, err := c.Outputs(ctx, "token"); err != nil || out["x"] != "via token" {
		t.Fatalf("outputs after reconnect: %v %v", out, err)
	}
}
