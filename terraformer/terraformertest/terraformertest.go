// Package terraformertest runs the real terraformer service in-process for tests: a real
// tfrun.Engine (real terraform and the offline provider mirror, from tfruntest), a kloud-style key
// server (GET /kite/keys from a kitekey.Keyring on an httptest server), the terraformer kite on
// 127.0.0.1 authenticating against it, and a Client connected as "kloud". Start with Start; the
// Env's KiteKey, Token and NewClient mint credentials for other users (auth tests).
package terraformertest

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/terraformer"
	"github.com/kloud-dev/kloud/terraformer/tfrun"
	"github.com/kloud-dev/kloud/terraformer/tfrun/tfruntest"
)

// Issuer is the iss of the credentials the Env signs (kontrol's default).
const Issuer = "kontrol"

// Options tune Start. Zero fields get the defaults in their comments.
type Options struct {
	// Engine configures the engine; Dir defaults to a temp dir, TerraformPath and CLIConfigFile
	// to tfruntest.Setup's (the test is skipped, or fails under CI=true, without them).
	Engine tfrun.Options
	// KloudUsers is passed to the service (default ["kloud"]).
	KloudUsers []string
	// Auth tunes the authenticator (KloudURL is set to the Env's key server).
	Auth terraformer.AuthOptions
}

// Keys is a kloud-style key server: kontrol's keyring and signer, and GET /kite/keys serving the
// keyring's public keys ({current, keys: [JWK]}) on an httptest server, as kloud does.
type Keys struct {
	t testing.TB
	// Keyring and Signer are kontrol's: rotate the keyring to test that terraformer follows.
	Keyring *kitekey.Keyring
	Signer  *kitekey.Signer
	// URL is the base URL: GET URL/kite/keys. Pass it as terraformer's --kloud-url.
	URL string

	fetches atomic.Int64
}

// StartKeys starts a key server with a fresh keyring; it stops when the test ends.
func StartKeys(t testing.TB) *Keys {
	t.Helper()
	kr, err := kitekey.NewKeyring(context.Background(), kitekey.KeyringOptions{Store: &kitekey.FileStore{Path: filepath.Join(t.TempDir(), "keys.json")}})
	if err != nil {
		t.Fatal(err)
	}
	k := &Keys{t: t, Keyring: kr, Signer: &kitekey.Signer{Current: kr.Current, Issuer: Issuer}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /kite/keys", func(w http.ResponseWriter, r *http.Request) {
		k.fetches.Add(1)
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"current": kr.Current().ID, "keys": kr.Public()})
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	k.URL = srv.URL
	return k
}

// Fetches counts the requests to GET /kite/keys.
func (k *Keys) Fetches() int64 { return k.fetches.Load() }

// KiteKey mints a kite key for username (a new kite id each time).
func (k *Keys) KiteKey(username string) string {
	k.t.Helper()
	key, err := k.Signer.KiteKey(username, uuid.NewString(), k.URL+"/kite")
	if err != nil {
		k.t.Fatal(err)
	}
	return key
}

// Token mints a token for username to call the kite kiteID.
func (k *Keys) Token(username, kiteID string, ttl time.Duration) string {
	k.t.Helper()
	tok, err := k.Signer.Token(username, kiteID, ttl)
	if err != nil {
		k.t.Fatal(err)
	}
	return tok
}

// KiteKeyAuth returns an auth func presenting a kite key for username.
func (k *Keys) KiteKeyAuth(username string) func(context.Context) (kite.Auth, error) {
	key := k.KiteKey(username)
	return func(context.Context) (kite.Auth, error) { return kite.Auth{Type: kite.AuthKiteKey, Key: key}, nil }
}

// Env is a running terraformer.
type Env struct {
	// Keys is the key server terraformer verifies callers with.
	*Keys
	t testing.TB

	Engine  *tfrun.Engine
	Service *terraformer.Service
	// Kite is terraformer's kite; Kite.Identity().ID is the audience of tokens for it.
	Kite *kite.Kite
	// URL is terraformer's kite URL (http://127.0.0.1:port/kite).
	URL string
	// Client is connected as "kloud" with a kite key.
	Client *terraformer.Client
}

// Start starts everything and stops it when the test ends.
func Start(t testing.TB, opts Options) *Env {
	t.Helper()
	var err error
	e := &Env{t: t, Keys: StartKeys(t)}
	e.Engine = tfruntest.NewEngine(t, opts.Engine) // closed at cleanup, after the kite (LIFO)
	auth := opts.Auth
	auth.KloudURL = e.Keys.URL
	if auth.Issuer == "" {
		auth.Issuer = Issuer
	}
	e.Kite, err = kite.New(kite.Options{
		Identity:      kite.Identity{Name: terraformer.Name},
		Authenticator: terraformer.NewAuthenticator(auth),
		Logger:        testutil.Logger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	e.Service, err = terraformer.New(terraformer.Options{Engine: e.Engine, Kite: e.Kite, KloudUsers: opts.KloudUsers, Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(terraformer.Handler(e.Kite, e.Engine))
	t.Cleanup(func() {
		e.Kite.Close()
		srv.Close()
	})
	e.URL = srv.URL + "/kite"
	e.Client = e.NewClient(e.KiteKeyAuth("kloud"))
	return e
}

// Token mints a token for username to call this terraformer (aud = its kite id).
func (e *Env) Token(username string, ttl time.Duration) string {
	e.t.Helper()
	return e.Keys.Token(username, e.Kite.Identity().ID, ttl)
}

// TokenAuth returns an auth func presenting a fresh token for username on every connection.
func (e *Env) TokenAuth(username string) func(context.Context) (kite.Auth, error) {
	return func(context.Context) (kite.Auth, error) {
		tok, err := e.Signer.Token(username, e.Kite.Identity().ID, 10*time.Minute)
		return kite.Auth{Type: kite.AuthToken, Key: tok}, err
	}
}

// NewClient connects a new client kite (named "kloud") with auth; it is closed when the test ends.
func (e *Env) NewClient(auth func(context.Context) (kite.Auth, error)) *terraformer.Client {
	e.t.Helper()
	return NewClient(e.t, e.URL, auth)
}

// Dial opens one raw connection with auth (no reconnects): the handshake's error is returned.
func (e *Env) Dial(ctx context.Context, auth kite.Auth) (*kite.Conn, error) {
	e.t.Helper()
	return clientKite(e.t).Dial(ctx, e.URL, auth)
}

// NewClient connects a new client kite (named "kloud") to the terraformer at url with auth; it is
// closed when the test ends.
func NewClient(t testing.TB, url string, auth func(context.Context) (kite.Auth, error)) *terraformer.Client {
	t.Helper()
	c := terraformer.NewClient(clientKite(t), url, auth)
	t.Cleanup(func() { c.Close() })
	return c
}

// DropConnections closes every connection to terraformer, as a network failure would.
func (e *Env) DropConnections() {
	for _, c := range e.Kite.Conns() {
		c.Close(nil)
	}
}

func clientKite(t testing.TB) *kite.Kite {
	t.Helper()
	k, err := kite.New(kite.Options{Identity: kite.Identity{Name: "kloud"}, Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	return k
}
