// Package kontroltest starts a real kontrol on loopback for tests: a kite with kontrol's methods,
// a file keyring in a temp dir, and an HTTP server that can be restarted on the same address.
package kontroltest

import (
	"context"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/kontrol"
)

// Options tune the test kontrol.
type Options struct {
	// PingInterval/PingTimeout of kontrol's kite: the heartbeat that drops half-open links.
	PingInterval, PingTimeout time.Duration
}

// Env is a running test kontrol.
type Env struct {
	t       testing.TB
	opts    Options
	dir     string
	addr    string
	Kite    *kite.Kite
	Kontrol *kontrol.Kontrol
	Keyring *kitekey.FileKeyring
	Revs    *kontrol.FileRevocations
	srv     *http.Server
}

// Start starts kontrol on 127.0.0.1 on a free port.
func Start(t testing.TB, opts Options) *Env {
	t.Helper()
	e := &Env{t: t, opts: opts, dir: t.TempDir()}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.addr = ln.Addr().String()
	e.start(ln)
	t.Cleanup(e.stop)
	return e
}

// URL is kontrol's kite URL.
func (e *Env) URL() string { return "http://" + e.addr + "/kite" }

func (e *Env) start(ln net.Listener) {
	t := e.t
	kr, err := kitekey.LoadOrCreateFileKeyring(filepath.Join(e.dir, "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	revs, err := kontrol.OpenFileRevocations(filepath.Join(e.dir, "revocations.json"))
	if err != nil {
		t.Fatal(err)
	}
	verifier := &kitekey.Verifier{Keys: kr.Keyring, Issuer: "kontrol", Revoked: revs}
	isAdmin := func(u string) bool { return u == "admin" }
	k, err := kite.New(kite.Options{
		Identity:      kite.Identity{Name: "kontrol", Username: "kontrol"},
		Authenticator: &kitekey.Authenticator{Verifier: verifier, IsAdmin: isAdmin, Agents: true},
		GateBuiltins:  kitekey.RefuseAgents,
		Logger:        testutil.Logger(t),
		PingInterval:  e.opts.PingInterval,
		PingTimeout:   e.opts.PingTimeout,
	})
	if err != nil {
		t.Fatal(err)
	}
	ko, err := kontrol.New(kontrol.Options{Kite: k, Keyring: kr.Keyring, Revocations: revs, URL: e.URL(), IsAdmin: isAdmin, Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/kite", k)
	e.Kite, e.Kontrol, e.Keyring, e.Revs = k, ko, kr, revs
	e.srv = &http.Server{Handler: mux}
	go e.srv.Serve(ln)
}

func (e *Env) stop() {
	e.Kite.Close()
	e.srv.Close()
}

// Restart stops kontrol (every connection drops) and starts a new one on the same address with
// the same keys.
func (e *Env) Restart() {
	e.t.Helper()
	e.stop()
	var ln net.Listener
	var err error
	testutil.Eventually(e.t, 10*time.Second, func() bool {
		ln, err = net.Listen("tcp", e.addr)
		return err == nil
	}, "listen again on %s: %v", e.addr, err)
	e.start(ln)
}

// KiteKey mints a kite key for username with a new kite id.
func (e *Env) KiteKey(username string) (key, id string) {
	e.t.Helper()
	key, id, err := e.Kontrol.CreateKey(username, "")
	if err != nil {
		e.t.Fatal(err)
	}
	return key, id
}

// KeyFile writes a kite key for username into a temp file and returns its path and kite id.
func (e *Env) KeyFile(username string) (path, id string) {
	e.t.Helper()
	key, id := e.KiteKey(username)
	path = filepath.Join(e.t.TempDir(), "kite.key")
	if err := kitekey.WriteFile(path, key); err != nil {
		e.t.Fatal(err)
	}
	return path, id
}

// Dial connects a new client kite named name to kontrol with the kite key of username.
func (e *Env) Dial(ctx context.Context, username, name string) (*kite.Conn, string) {
	e.t.Helper()
	key, id := e.KiteKey(username)
	k, err := kite.New(kite.Options{Identity: kite.Identity{Name: name}, Logger: testutil.Logger(e.t)})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { k.Close() })
	c, err := k.Dial(ctx, e.URL(), kite.Auth{Type: kite.AuthKiteKey, Key: key})
	if err != nil {
		e.t.Fatal(err)
	}
	return c, id
}

// AgentKey mints a machine agent's key (kind agentKey) for a machine of owner, with a new
// agent kite id.
func (e *Env) AgentKey(owner, machineID string) (key, id string) {
	e.t.Helper()
	key, id, err := e.Kontrol.CreateAgentKey(kitekey.AgentKeySpec{Owner: owner, MachineID: machineID, StackID: "stack-1"})
	if err != nil {
		e.t.Fatal(err)
	}
	return key, id
}

// DialKey connects a new client kite named name to kontrol with key (any kind: the kite key
// auth type is sent, and the key's kind decides).
func (e *Env) DialKey(ctx context.Context, key, name string) (*kite.Conn, error) {
	e.t.Helper()
	k, err := kite.New(kite.Options{Identity: kite.Identity{Name: name}, Logger: testutil.Logger(e.t)})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { k.Close() })
	return k.Dial(ctx, e.URL(), kite.Auth{Type: kite.AuthKiteKey, Key: key})
}
