// Package sshserver is klient's SSH server: one SSH connection per tunnel that kloud already
// authenticated (klient's ssh.connect, docs/protocol.md "SSH"), so OpenSSH, scp, sftp, rsync,
// git and IDEs reach a machine with no inbound port. The SSH layer asks for no password or key:
// kloud checked the user and klient's access list chose the machine account (ConnInfo.Account);
// the SSH user name must be that account.
//
// Start with Server.Serve. What a connection may do:
//   - "session" channels: shell (with a pty: a web terminal session through Terminals, listed
//     and viewable like the browser's, killed when the channel closes; without: the login shell
//     on pipes), exec (the account's login shell -c, with or without a pty), subsystem sftp
//     (Options.SFTP, a process that already runs as the account); env limited to SafeEnv;
//     window-change resizes; exit-status and exit-signal are returned. Agent and X11
//     forwarding are refused.
//   - "direct-tcpip" (ssh -L): to the machine's own addresses only (loopback and its
//     interfaces), dialled by klient as port.connect does.
//   - Global requests ("tcpip-forward", ssh -R, ...) are refused.
package sshserver

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/crypto/ssh"

	"github.com/kloud-dev/kloud/klient/webterm"
)

// Terminals holds shells with a pty (klient's webterm.Manager).
type Terminals interface {
	Open(r webterm.OpenRequest) (v *webterm.Viewer, created bool, err error)
	Kill(id, reason string) error
}

// Options configure a Server.
type Options struct {
	// HostKey is the server's host key (required; LoadHostKey).
	HostKey ssh.Signer
	// Terminals runs shells with a pty (required).
	Terminals Terminals
	// Root is where the machine's /etc/passwd is read (default "/").
	Root string
	// SFTP returns the command that serves the sftp subsystem on its stdin and stdout, run as
	// the account (klient re-executed: klient.SFTPCommand). Nil: sftp is refused.
	SFTP func() *exec.Cmd
	// Dial connects direct-tcpip channels (default: a net.Dialer, to the machine's own
	// addresses only: see Local).
	Dial func(ctx context.Context, host string, port int) (net.Conn, error)
	// Logger: nil discards.
	Logger *slog.Logger
}

// Server serves SSH connections.
type Server struct {
	o   Options
	log *slog.Logger
}

// New returns a Server.
func New(o Options) (*Server, error) {
	if o.HostKey == nil || o.Terminals == nil {
		return nil, errors.New("sshserver: Options.HostKey and Terminals are required")
	}
	if o.Root == "" {
		o.Root = "/"
	}
	if o.Dial == nil {
		o.Dial = dialLocal
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Server{o: o, log: o.Logger}, nil
}

// ConnInfo says whose connection it is.
type ConnInfo struct {
	User    string // the kloud user (kloud authenticated the tunnel)
	Account string // the machine account sessions run as; the SSH user name must be it
}

// Serve runs the SSH server side of nc until the connection ends (the client leaves, or the
// caller closes nc: a revoked share), then ends what it started.
func (s *Server) Serve(ctx context.Context, nc net.Conn, ci ConnInfo) error {
	cfg := &ssh.ServerConfig{
		NoClientAuth: true,
		NoClientAuthCallback: func(cm ssh.ConnMetadata) (*ssh.Permissions, error) {
			return nil, checkUser(cm.User(), ci.Account)
		},
		// Clients that skip "none" (or offer keys first) are accepted the same way: the
		// tunnel is the authentication.
		PublicKeyCallback: func(cm ssh.ConnMetadata, _ ssh.PublicKey) (*ssh.Permissions, error) {
			return nil, checkUser(cm.User(), ci.Account)
		},
		ServerVersion: "SSH-2.0-kloud-klient",
	}
	cfg.AddHostKey(s.o.HostKey)
	sc, chans, reqs, err := ssh.NewServerConn(nc, cfg)
	if err != nil {
		nc.Close()
		return fmt.Errorf("ssh handshake: %w", err)
	}
	defer sc.Close()
	acct, err := webterm.LookupAccount(s.o.Root, ci.Account)
	if err != nil {
		return fmt.Errorf("ssh: %w", err)
	}
	log := s.log.With("user", ci.User, "account", ci.Account)
	base := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { <-ctx.Done(); sc.Close() }()
	go refuseGlobal(reqs)
	var wg sync.WaitGroup
	defer wg.Wait()
	for nch := range chans {
		switch nch.ChannelType() {
		case "session":
			ch, creqs, err := nch.Accept()
			if err != nil {
				continue
			}
			ss := &session{s: s, ctx: ctx, base: base, ch: ch, info: ci, acct: acct, log: log}
			wg.Add(1)
			go func() { defer wg.Done(); ss.run(creqs) }()
		case "direct-tcpip":
			wg.Add(1)
			go func() { defer wg.Done(); s.directTCPIP(ctx, nch, log) }()
		default:
			nch.Reject(ssh.UnknownChannelType, "kloud's SSH serves session and direct-tcpip channels only")
		}
	}
	cancel()
	return nil
}

// checkUser accepts the SSH user name account only (config-ssh writes it as the User).
func checkUser(name, account string) error {
	if name == account {
		return nil
	}
	return fmt.Errorf("ssh user %q: this connection runs as %q (User %s in the ssh config)", name, account, account)
}

// refuseGlobal answers every global request no: tcpip-forward (ssh -R) and the rest.
func refuseGlobal(reqs <-chan *ssh.Request) {
	for r := range reqs {
		if r.WantReply {
			r.Reply(false, nil)
		}
	}
}

// HostKeyFile is the host key's file in klient's state dir.
const HostKeyFile = "ssh_host_ed25519_key"

// LoadHostKey reads the ed25519 host key at path (OpenSSH private key format), creating it
// (0600, its directory 0700) the first time.
func LoadHostKey(path string) (ssh.Signer, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		_, priv, gerr := ed25519.GenerateKey(rand.Reader)
		if gerr != nil {
			return nil, fmt.Errorf("ssh host key: %w", gerr)
		}
		blk, merr := ssh.MarshalPrivateKey(priv, "kloud klient host key")
		if merr != nil {
			return nil, fmt.Errorf("ssh host key: %w", merr)
		}
		b = pem.EncodeToMemory(blk)
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, fmt.Errorf("ssh host key: %w", err)
		}
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, b, 0o600); err != nil {
			return nil, fmt.Errorf("ssh host key: %w", err)
		}
		if err := os.Rename(tmp, path); err != nil {
			return nil, fmt.Errorf("ssh host key: %w", err)
		}
	} else if err != nil {
		return nil, fmt.Errorf("ssh host key: %w", err)
	}
	signer, err := ssh.ParsePrivateKey(b)
	if err != nil {
		return nil, fmt.Errorf("ssh host key %s: %w", path, err)
	}
	return signer, nil
}

// AuthorizedKey is k as one authorized_keys / known_hosts key ("ssh-ed25519 AAAA...").
func AuthorizedKey(k ssh.PublicKey) string {
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(k)))
}
