package klient

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/kloud-dev/kloud/internal/selfexec"
	"github.com/kloud-dev/kloud/internal/tunnel"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/klient/klientapi"
	"github.com/kloud-dev/kloud/klient/sshserver"
	"github.com/kloud-dev/kloud/klient/webterm"
)

// SSH (docs/protocol.md "SSH"): ssh.connect serves one SSH connection (package sshserver) on a
// tunnel klient dials back to kloud's attach endpoint, as port.connect does. kloud checked the
// user; klient checks the token against its access list (the owner, terminal and full shares;
// read-only is refused) and runs the connection's sessions as the account a terminal of that
// user would run as (runAs). The host key (ed25519, sshserver.HostKeyFile in the state dir,
// 0600) is made once and reported in klient.info and ssh.hostKey, which kloud hands to
// `kloud config-ssh` (the client's known_hosts: no trust on first use). A change of a user's
// grant closes that user's SSH connections at once (enforce).

// SFTPServerArg is the argument klient is re-executed with to serve sftp on its stdin and
// stdout, as the account (cmd/klient calls sshserver.ServeSFTP).
const SFTPServerArg = "sftp-server"

// MaxSSHConnsPerUser bounds the SSH connections one user has open on the machine at once (an
// IDE opens a few; a runaway loop must not exhaust klient).
const MaxSSHConnsPerUser = 64

// sshState is klient's SSH server and its open connections.
type sshState struct {
	mu     sync.Mutex
	srv    *sshserver.Server
	signer ssh.Signer
	conns  map[*tunnel.Conn]string // → the kloud user
}

func (kl *Klient) handleSSH() {
	kl.ssh = &sshState{conns: map[*tunnel.Conn]string{}}
	kl.kite.Handle(klientapi.MethodSSHConnect, kite.Typed(kl.sshConnect), kite.WithTimeout(time.Minute))
	kl.kite.Handle(klientapi.MethodSSHHostKey, kite.Typed(kl.sshHostKey))
}

// sshServer returns the SSH server, loading (or making) the host key the first time.
func (kl *Klient) sshServer() (*sshserver.Server, ssh.Signer, error) {
	st := kl.ssh
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.srv != nil {
		return st.srv, st.signer, nil
	}
	signer, err := sshserver.LoadHostKey(filepath.Join(kl.opts.StateDir, sshserver.HostKeyFile))
	if err != nil {
		return nil, nil, err
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, nil, fmt.Errorf("ssh: %w", err)
	}
	srv, err := sshserver.New(sshserver.Options{HostKey: signer, Terminals: kl.term, Root: kl.opts.Root, Logger: kl.log,
		SFTP: func() *exec.Cmd {
			return &exec.Cmd{Path: exe, Args: []string{"klient", SFTPServerArg}, Env: selfexec.Env()}
		}})
	if err != nil {
		return nil, nil, err
	}
	st.srv, st.signer = srv, signer
	return srv, signer, nil
}

// hostKeyLine is the host key as an authorized_keys line ("" when it cannot be had).
func (kl *Klient) hostKeyLine() string {
	_, signer, err := kl.sshServer()
	if err != nil {
		kl.log.Warn("ssh host key", "err", err)
		return ""
	}
	return sshserver.AuthorizedKey(signer.PublicKey())
}

// sshAccount is the account user's SSH sessions run as (created for a terminal share, as a
// terminal's).
func (kl *Klient) sshAccount(ctx context.Context, user, role string) (string, error) {
	account, _, err := kl.runAs(ctx, user, role)
	if err != nil {
		return "", fmt.Errorf("%s: %w", klientapi.MethodSSHConnect, err)
	}
	return account, nil
}

func (kl *Klient) sshHostKey(ctx context.Context, r *kite.Request, p *klientapi.SSHHostKeyParams) (any, error) {
	user, role, err := kl.authorize(ctx, r, p.Token, permTerminal)
	if err != nil {
		return nil, err
	}
	_, signer, err := kl.sshServer()
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %w", r.Method, err, kite.ErrState)
	}
	account := kl.opts.Owner
	if !allowed(role, permExec) {
		if account, err = webterm.SharedAccountName(user); err != nil {
			return nil, err
		}
	}
	return klientapi.SSHHostKeyResult{HostKey: sshserver.AuthorizedKey(signer.PublicKey()), Account: account}, nil
}

func (kl *Klient) sshConnect(ctx context.Context, r *kite.Request, p *klientapi.SSHConnectParams) (any, error) {
	user, role, err := kl.authorize(ctx, r, p.Token, permTerminal)
	if err != nil {
		return nil, err
	}
	srv, _, err := kl.sshServer()
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %w", r.Method, err, kite.ErrState)
	}
	account, err := kl.sshAccount(ctx, user, role)
	if err != nil {
		return nil, err
	}
	t, err := kl.dialTunnel(ctx, p.Attach)
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %w", r.Method, err, kite.ErrState)
	}
	kl.ssh.mu.Lock()
	n := 0
	for _, u := range kl.ssh.conns {
		if u == user {
			n++
		}
	}
	if n >= MaxSSHConnsPerUser {
		kl.ssh.mu.Unlock()
		t.CloseWith(tunnel.CloseRefused, "too many SSH connections")
		return nil, fmt.Errorf("%s: %s has %d SSH connections to this machine, the limit: close some first: %w", r.Method, user, n, kite.ErrState)
	}
	kl.ssh.conns[t] = user
	kl.ssh.mu.Unlock()
	// An unshare between authorize and here must not leave this connection behind.
	if role := kl.roleOf(user); !allowed(role, permTerminal) {
		kl.dropSSH(t)
		t.Close()
		return nil, fmt.Errorf("%s: this machine is no longer shared with %s: %w", r.Method, user, kite.ErrPermission)
	}
	kl.log.Info("ssh connection opened", "user", user, "account", account)
	go func() {
		defer kl.dropSSH(t)
		err := srv.Serve(kl.ctx, t, sshserver.ConnInfo{User: user, Account: account})
		kl.log.Info("ssh connection closed", "user", user, "account", account, "err", err)
	}()
	return klientapi.SSHConnectResult{Account: account}, nil
}

func (kl *Klient) dropSSH(t *tunnel.Conn) {
	kl.ssh.mu.Lock()
	delete(kl.ssh.conns, t)
	kl.ssh.mu.Unlock()
}

// closeSSH closes every SSH connection of user (its grant changed: it reconnects with what the
// new grant gives, or not at all); it returns how many.
func (kl *Klient) closeSSH(user string) int {
	kl.ssh.mu.Lock()
	var ts []*tunnel.Conn
	for t, u := range kl.ssh.conns {
		if u == user {
			ts = append(ts, t)
		}
	}
	kl.ssh.mu.Unlock()
	// Closing the tunnel ends the SSH connection (its sessions are hung up). The close frames
	// are sent before this returns (waited for at most 2 s): the caller then kills the user's
	// processes, and a shell killed first would end the SSH session cleanly, its client never
	// told why.
	var wg sync.WaitGroup
	for _, t := range ts {
		wg.Go(func() { t.CloseWith(tunnel.CloseRefused, "this machine's share with you changed") })
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
	}
	if len(ts) > 0 {
		kl.log.Info("share changed: closed ssh connections", "user", user, "count", len(ts))
	}
	return len(ts)
}
