package klient_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/klient/klientapi"
	"github.com/kloud-dev/kloud/klient/webterm"
	"github.com/kloud-dev/kloud/klient/webterm/webtermtest"
	"github.com/kloud-dev/kloud/userdata"
)

// TestAdoptHandsTheMachineOver drives the real klient binary, started as a prebuilt machine's
// agent (the agent key of machine m1 for alice, standing for the pool's account; no --owner):
// klient.adopt refuses keys that are not this machine's new owner's; with bob's key it ends
// alice's terminal session, renames her account (login, group, sudo rule; same uid), writes the
// key and restarts in place, registering as bob's agent with the new kite id; bob's token then
// opens a terminal as the owner, alice's no longer does, and the same call again answers
// Already.
func TestAdoptHandsTheMachineOver(t *testing.T) {
	testutil.RequireRoot(t) // holders run shells as the machine's owner account; usermod
	testutil.RequireBinary(t, "usermod")
	e := prepareEnv(t, true)
	m := e.mach
	m.WritePasswd(t, fmt.Sprintf("alice:x:%d:%d:%s:%s:%s\n", m.UID, m.UID, userdata.OwnerGecos, m.Home, m.Shell))
	sudoers := filepath.Join(m.Root, "etc/sudoers.d/90-cloud-init-users")
	if err := os.MkdirAll(filepath.Dir(sudoers), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(sudoers, []byte("\n# User rules for alice\nalice ALL=(ALL) NOPASSWD:ALL\n\n"), 0o440); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	proc := e.startProcess(testutil.BuildBinary(t, "./cmd/klient"), filepath.Join(dir, "sessions"))
	id := webtermtest.UniqueSession(t)
	l, _ := e.mustConnect("alice", webterm.ConnectParams{Session: id, Mode: webterm.ModeAttach})
	l.Type(t, "echo pool-$((6*7))\r")
	l.WaitFor(t, "pool-42")

	mint := func(owner, machine string) (string, string) {
		key, kid, err := e.ko.Kontrol.CreateAgentKey(kitekey.AgentKeySpec{Owner: owner, MachineID: machine, StackID: "s1", KontrolURL: e.srv.URL + "/kite"})
		if err != nil {
			t.Fatal(err)
		}
		return key, kid
	}
	// Refused, and nothing changed: another machine's key, a key of another owner, no key.
	other, _ := mint("bob", "m2")
	carols, _ := mint("carol", "m1")
	for _, p := range []klientapi.AdoptParams{{Owner: "bob", Key: other}, {Owner: "bob", Key: carols}, {Owner: "bob", Key: "x"}, {Owner: "Bob!", Key: carols}} {
		if err := e.call(klientapi.MethodAdopt, p, nil); !errors.Is(err, kite.ErrInvalidParams) {
			t.Errorf("klient.adopt %s with a wrong key: %v, want invalid params", p.Owner, err)
		}
	}
	if _, _, _, ok := m.Account(t, "alice"); !ok {
		t.Fatal("a refused klient.adopt changed the account")
	}

	key, newID := mint("bob", "m1")
	var res klientapi.AdoptResult
	before := e.conn
	if err := e.call(klientapi.MethodAdopt, klientapi.AdoptParams{Owner: "bob", Key: key}, &res); err != nil {
		t.Fatalf("klient.adopt: %v", err)
	}
	t.Logf("klient.adopt: %+v", res)
	if res.OldOwner != "alice" || res.Owner != "bob" || res.KiteID != newID || res.Account != "renamed" || res.Ended != 1 || res.Already {
		t.Errorf("klient.adopt answered %+v", res)
	}
	if c := l.Closed(t); c.Code != webterm.CloseEnded || !strings.Contains(c.Reason, "handed to bob") {
		t.Errorf("alice's session closed with %d %q, want ended: handed to bob", c.Code, c.Reason)
	}
	oldID := e.kiteID
	e.kiteID = newID
	e.waitRegistered(before)
	if e.ko.Kontrol.Conn(oldID) != nil {
		t.Error("the old kite id is still registered")
	}
	var info klientapi.Info
	if err := e.call(klientapi.MethodInfo, nil, &info); err != nil || info.Owner != "bob" || info.KiteID != newID {
		t.Fatalf("klient.info after the handover: %+v %v (want owner bob, kite %s)", info, err, newID)
	}
	if err := proc.Signal(syscall.Signal(0)); err != nil {
		t.Errorf("klient's process %d: %v (it restarts in place)", proc.Pid, err)
	}
	if uid, _, gecos, ok := m.Account(t, "bob"); !ok || uid != m.UID || gecos != userdata.OwnerGecos {
		t.Errorf("bob's account: uid %d %q %v, want alice's renamed (uid %d)", uid, gecos, ok, m.UID)
	}
	if _, _, _, ok := m.Account(t, "alice"); ok {
		t.Error("alice's account is still there")
	}
	if b, _ := os.ReadFile(filepath.Join(m.Root, "etc/group")); !strings.HasPrefix(string(b), fmt.Sprintf("bob:x:%d:", m.UID)) {
		t.Errorf("etc/group after the handover:\n%s", b)
	}
	if b, _ := os.ReadFile(sudoers); string(b) != "\n# User rules for bob\nbob ALL=(ALL) NOPASSWD:ALL\n\n" {
		t.Errorf("sudo rule after the handover:\n%s", b)
	}
	if got, _ := kitekey.ReadFile(e.keyFile); got != key {
		t.Error("kite.key is not the new key")
	}

	// The owner is bob now: his terminal opens; alice, no longer owner nor shared with, is refused.
	l2, _ := e.mustConnect("bob", webterm.ConnectParams{Session: webtermtest.UniqueSession(t), Mode: webterm.ModeAttach})
	l2.Type(t, "echo owner-$((6*7))\r")
	l2.WaitFor(t, "owner-42")
	if _, _, err := e.connect(webterm.ConnectParams{Session: webtermtest.UniqueSession(t), Mode: webterm.ModeAttach, Token: e.token("alice")}); !errors.Is(err, kite.ErrPermission) {
		t.Errorf("alice's terminal after the handover: %v, want permission denied", err)
	}
	// Again with the same key (kloud's claim resumed after a restart): nothing to do.
	if err := e.call(klientapi.MethodAdopt, klientapi.AdoptParams{Owner: "bob", Key: key}, &res); err != nil || !res.Already {
		t.Errorf("klient.adopt again: %+v %v, want Already", res, err)
	}
}

// TestAdoptOnlyFromKloud: klient.adopt and klient.upgrade answer only on the connection klient
// dialed (kloud's). The machine's own owner, dialing klient's listener with her kite key, is
// refused, and the machine keeps its key and owner.
func TestAdoptOnlyFromKloud(t *testing.T) {
	e := prepareEnv(t, true)
	e.listen = testutil.FreeLoopback(t)
	e.start()
	k, err := kite.New(kite.Options{Identity: kite.Identity{Name: "cli"}, Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	key, _ := e.ko.KiteKey("alice")
	c, err := k.Dial(t.Context(), "http://"+e.listen+"/kite", kite.Auth{Type: kite.AuthKiteKey, Key: key})
	if err != nil {
		t.Fatal(err)
	}
	bobs, _, err := e.ko.Kontrol.CreateAgentKey(kitekey.AgentKeySpec{Owner: "bob", MachineID: "m1", StackID: "s1", KontrolURL: e.srv.URL + "/kite"})
	if err != nil {
		t.Fatal(err)
	}
	before, _ := kitekey.ReadFile(e.keyFile)
	if err := c.Call(t.Context(), klientapi.MethodAdopt, klientapi.AdoptParams{Owner: "bob", Key: bobs}, nil); !errors.Is(err, kite.ErrPermission) {
		t.Errorf("klient.adopt from a user's own connection: %v, want permission denied", err)
	}
	if err := c.Call(t.Context(), klientapi.MethodUpgrade, klientapi.UpgradeParams{SHA256: strings.Repeat("0", 64)}, nil); !errors.Is(err, kite.ErrPermission) {
		t.Errorf("klient.upgrade from a user's own connection: %v, want permission denied", err)
	}
	var info klientapi.Info
	if err := e.call(klientapi.MethodInfo, nil, &info); err != nil || info.Owner != "alice" || info.KiteID != e.kiteID {
		t.Errorf("klient.info after the refused calls: %+v %v", info, err)
	}
	if after, _ := kitekey.ReadFile(e.keyFile); after != before {
		t.Error("a refused klient.adopt changed kite.key")
	}
}
