package klient_test

import (
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/coder/websocket"
	"golang.org/x/crypto/ssh"

	"github.com/kloud-dev/kloud/internal/tunnel"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/klient"
	"github.com/kloud-dev/kloud/klient/klientapi"
	"github.com/kloud-dev/kloud/klient/sshserver"
	"github.com/kloud-dev/kloud/klient/webterm"
)

// sshConnect calls ssh.connect as user and returns klient's end of the tunnel.
func (e *env) sshConnect(user string) (*tunnel.Conn, klientapi.SSHConnectResult, error) {
	e.t.Helper()
	ticket := rand.Text()
	ch := make(chan *websocket.Conn, 1)
	e.mu.Lock()
	e.legs[ticket] = ch
	e.mu.Unlock()
	var res klientapi.SSHConnectResult
	err := e.call(klientapi.MethodSSHConnect, klientapi.SSHConnectParams{Token: e.token(user),
		Attach: webterm.Attach{URL: e.srv.URL + webterm.AttachPath, Ticket: ticket}}, &res)
	if err != nil {
		return nil, res, err
	}
	select {
	case ws := <-ch:
		t := tunnel.New(ws, "test", nil)
		e.t.Cleanup(func() { ws.CloseNow() })
		return t, res, nil
	case <-time.After(wait):
		e.t.Fatal("klient did not dial the attach URL")
	}
	return nil, res, nil
}

// TestSSHGrantsAndRevocation: klient's own checks of ssh.connect and ssh.hostKey (the owner and
// full shares get the owner's account, a terminal share its own, a read-only share nothing), the
// host key made once (0600) and reported, and a share change closing the user's connection.
func TestSSHGrantsAndRevocation(t *testing.T) {
	e := newEnv(t)
	var hk klientapi.SSHHostKeyResult
	if err := e.call(klientapi.MethodSSHHostKey, klientapi.SSHHostKeyParams{Token: e.token("alice")}, &hk); err != nil {
		t.Fatal(err)
	}
	if hk.Account != "alice" || hk.HostKey == "" {
		t.Fatalf("ssh.hostKey as the owner: %+v", hk)
	}
	var info klient.Info
	if err := e.call(klientapi.MethodInfo, nil, &info); err != nil || info.SSHHostKey != hk.HostKey {
		t.Errorf("klient.info's host key %q, ssh.hostKey's %q (%v)", info.SSHHostKey, hk.HostKey, err)
	}
	if fi, err := os.Stat(filepath.Join(e.stateDir, sshserver.HostKeyFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("the host key file: %v %v", fi, err)
	}
	pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(hk.HostKey))
	if err != nil {
		t.Fatal(err)
	}

	e.share("dave", klient.GrantReadonly)
	if _, _, err := e.sshConnect("dave"); !errors.Is(err, kite.ErrPermission) {
		t.Errorf("ssh.connect of a read-only share: %v", err)
	}
	if err := e.call(klientapi.MethodSSHHostKey, klientapi.SSHHostKeyParams{Token: e.token("dave")}, nil); !errors.Is(err, kite.ErrPermission) {
		t.Errorf("ssh.hostKey of a read-only share: %v", err)
	}
	if _, _, err := e.sshConnect("mallory"); !errors.Is(err, kite.ErrPermission) {
		t.Errorf("ssh.connect of a user the machine is not shared with: %v", err)
	}

	// A full share runs as the owner's account; unsharing closes its connection at once.
	e.share("carol", klient.GrantFull)
	tc, res, err := e.sshConnect("carol")
	if err != nil || res.Account != "alice" {
		t.Fatalf("ssh.connect of a full share: %+v %v", res, err)
	}
	cfg := &ssh.ClientConfig{User: "alice", HostKeyCallback: ssh.FixedHostKey(pub), Timeout: wait}
	sc, chans, reqs, err := ssh.NewClientConn(tc, "kloud--m1", cfg)
	if err != nil {
		t.Fatalf("SSH handshake through the tunnel: %v", err)
	}
	c := ssh.NewClient(sc, chans, reqs)
	defer c.Close()
	closed := make(chan struct{})
	var werr error
	go func() { werr = c.Wait(); close(closed) }()
	if err := e.call("klient.unshare", klient.UnshareParams{Username: "carol", Token: e.token("alice")}, nil); err != nil {
		t.Fatal(err)
	}
	// The close frame was sent before unshare answered (before the user's processes are
	// killed): its reason reaches the client, not a clean end of the session.
	select {
	case <-closed:
	case <-time.After(wait):
		t.Fatal("the unshared user's SSH connection is still open")
	}
	var ce websocket.CloseError
	if !errors.As(werr, &ce) || ce.Code != tunnel.CloseRefused || ce.Reason != "this machine's share with you changed" {
		t.Errorf("the unshared user's SSH connection ended with %v, not the share's close reason", werr)
	}
}
