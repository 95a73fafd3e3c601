package klient_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/klient"
	"github.com/kloud-dev/kloud/klient/webterm"
	"github.com/kloud-dev/kloud/klient/webterm/webtermtest"
)

// TestSharedUserShells: which account a shared user's shell runs as, per grant. klient holds an
// agent key (as on a machine) and takes the owner from its claims. terminal: the user's own
// account, created on demand (marked, non-system uid, home under /home), which cannot read a
// root-only key file; full: the owner's account; readonly: watch only. An existing account
// klient did not create is never handed out.
func TestSharedUserShells(t *testing.T) {
	testutil.RequireRoot(t)
	e := newEnvKey(t, true)
	var info klient.Info
	if err := e.call("klient.info", nil, &info); err != nil || info.Owner != "alice" || info.KiteID != e.kiteID {
		t.Fatalf("klient.info with an agent key: %+v %v", info, err)
	}
	if reg := e.ko.Kontrol.Lookup(kite.Identity{ID: e.kiteID}); len(reg) != 1 || reg[0].Kite.Username != "alice" {
		t.Fatalf("registered as %+v, want alice's kite %s", reg, e.kiteID)
	}
	// A root-only file like /etc/kloud/kite.key, in a directory everyone may enter.
	secret := filepath.Join(e.mach.Root, "etc", "kite.key")
	if err := os.WriteFile(secret, []byte("SECRET-KEY\n"), 0o400); err != nil {
		t.Fatal(err)
	}
	e.share("bob", klient.GrantTerminal)
	e.share("frank", klient.GrantFull)
	e.share("rita", klient.GrantReadonly)

	owner, _ := e.mustConnect("alice", webterm.ConnectParams{Session: "owner-s"})
	bob, res := e.mustConnect("bob", webterm.ConnectParams{Session: "bob-s"})
	if !res.Created {
		t.Fatalf("bob's connect: %+v", res)
	}
	uid, home, gecos, ok := e.mach.Account(t, "bob")
	if !ok || uid < 1000 || uid == webtermtest.TestUID || home != "/home/bob" || !strings.HasPrefix(gecos, webterm.SharedAccountGecos) {
		t.Fatalf("bob's account: uid %d home %q gecos %q ok %v", uid, home, gecos, ok)
	}
	if fi, err := os.Stat(filepath.Join(e.mach.Root, "home", "bob")); err != nil || !fi.IsDir() {
		t.Fatalf("bob's home: %v", err)
	}
	bob.Type(t, fmt.Sprintf("echo uid=$(id -u)-$((1+1)); cat %s; echo rc=$?\r", secret))
	bob.WaitFor(t, fmt.Sprintf("uid=%d-2", uid))
	bob.WaitFor(t, "rc=1")
	if !strings.Contains(bob.Output(), "Permission denied") || strings.Contains(bob.Output(), "SECRET-KEY") {
		t.Fatalf("bob read the root-only key:\n%s", bob.Output())
	}
	for _, in := range e.list("alice") {
		want := map[string]string{"owner-s": "alice", "bob-s": "bob"}[in.Session]
		if in.RunAs != want {
			t.Errorf("session %s runs as %q, want %q", in.Session, in.RunAs, want)
		}
	}
	// bob cannot type into the owner's session; he may watch it.
	if _, _, err := e.connect(webterm.ConnectParams{Session: "owner-s", Mode: webterm.ModeShared, Token: e.token("bob")}); !errors.Is(err, kite.ErrPermission) {
		t.Fatalf("terminal share joined the owner's session writable: %v", err)
	}
	watch, _ := e.mustConnect("bob", webterm.ConnectParams{Session: "owner-s", Mode: webterm.ModeReadonly})
	owner.Type(t, "echo owner-uid=$(id -u)\r")
	watch.WaitFor(t, fmt.Sprintf("owner-uid=%d", webtermtest.TestUID))

	// full: the owner's account, and may type into the owner's sessions.
	frank, _ := e.mustConnect("frank", webterm.ConnectParams{})
	frank.Type(t, "echo frank-uid=$(id -u)\r")
	frank.WaitFor(t, fmt.Sprintf("frank-uid=%d", webtermtest.TestUID))
	e.mustConnect("frank", webterm.ConnectParams{Session: "owner-s", Mode: webterm.ModeShared})

	// readonly: no shell of its own.
	if _, _, err := e.connect(webterm.ConnectParams{Token: e.token("rita")}); !errors.Is(err, kite.ErrPermission) {
		t.Fatalf("readonly share started a shell: %v", err)
	}
	if _, _, _, ok := e.mach.Account(t, "rita"); ok {
		t.Fatal("an account was made for a readonly share")
	}

	// Unsharing ends what runs as bob's account, even what he left in the background, and
	// expires it; sharing again brings it back.
	bob.Type(t, "setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo BG=$((7*7))\r")
	bob.WaitFor(t, "BG=49")
	if err := e.call("klient.unshare", klient.UnshareParams{Username: "bob", Token: e.token("alice")}, nil); err != nil {
		t.Fatal(err)
	}
	if c := bob.Closed(t); c.Code != webterm.CloseUnshared && c.Code != webterm.CloseEnded {
		t.Fatalf("bob's terminal after unshare: %+v", c)
	}
	// Killed processes may linger as zombies for a moment until their parent reaps them.
	testutil.Eventually(t, 10*time.Second, func() bool { return len(uidProcesses(t, uid)) == 0 },
		"processes of bob's account after unshare: %v", uidProcesses(t, uid))
	for _, in := range e.list("alice") {
		if in.RunAs == "bob" {
			t.Fatalf("a session of bob's account after unshare: %+v", in)
		}
	}
	if exp := shadowExpire(t, e.mach.Root, "bob"); exp == "" {
		t.Fatal("bob's account is not expired after unshare")
	}
	e.share("bob", klient.GrantTerminal)
	again, _ := e.mustConnect("bob", webterm.ConnectParams{})
	again.Type(t, "echo AGAIN=$(id -u)\r")
	again.WaitFor(t, fmt.Sprintf("AGAIN=%d", uid))
	if exp := shadowExpire(t, e.mach.Root, "bob"); exp != "" {
		t.Fatalf("bob's account still expires %q after sharing again", exp)
	}

	// An account klient did not make is not handed to a shared user of that name.
	pw, err := os.ReadFile(filepath.Join(e.mach.Root, "etc/passwd"))
	if err != nil {
		t.Fatal(err)
	}
	e.mach.WritePasswd(t, string(pw)+"mallory:x:1500:1500:someone else:/home/mallory:/bin/bash\nsys:x:3:3:sys:/dev:/usr/sbin/nologin\n")
	for _, u := range []string{"mallory", "sys"} {
		e.share(u, klient.GrantTerminal)
		_, _, err := e.connect(webterm.ConnectParams{Token: e.token(u)})
		if !errors.Is(err, kite.ErrPermission) || !strings.Contains(err.Error(), "did not create") {
			t.Errorf("%s's terminal share with an existing account: %v", u, err)
		}
	}
}

// TestSharedAccountName: only names kloud could have given a user become accounts.
func TestSharedAccountName(t *testing.T) {
	for _, u := range []string{"bob", "a", "bob-2", "x123456789012345678901234567890y"} {
		if n, err := webterm.SharedAccountName(u); err != nil || n != u {
			t.Errorf("%q: %q %v", u, n, err)
		}
	}
	for _, u := range []string{"", "Bob", "2bob", "bob.smith", "bob:x", "../bob", "-bob", "machine:m1", strings.Repeat("a", 33)} {
		if _, err := webterm.SharedAccount(context.Background(), "/nonexistent", u); err == nil {
			t.Errorf("%q accepted", u)
		}
	}
}

// uidProcesses lists the pids whose uids include uid.
func uidProcesses(t *testing.T, uid int) []string {
	t.Helper()
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			if rest, ok := strings.CutPrefix(l, "Uid:"); ok && slices.Contains(strings.Fields(rest), strconv.Itoa(uid)) {
				out = append(out, e.Name())
			}
		}
	}
	return out
}

// shadowExpire is the account expiry field of name in root/etc/shadow.
func shadowExpire(t *testing.T, root, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "etc/shadow"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Split(l, ":"); len(f) >= 8 && f[0] == name {
			return f[7]
		}
	}
	t.Fatalf("%s is not in shadow", name)
	return ""
}
