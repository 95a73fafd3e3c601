package sshserver_test

import (
	"context"
	"errors"
	"io"
	"net"
	"os/user"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/klient/sshserver"
	"github.com/kloud-dev/kloud/klient/webterm"
)

// start serves one SSH connection for the account this test runs as (a real webterm.Manager
// for shells) and dials it as sshUser; it returns the client (nil and the error when the
// handshake fails) and the Manager.
func start(t *testing.T, sshUser string) (*ssh.Client, *webterm.Manager, error) {
	t.Helper()
	c, term, _, err := startStoppable(t, sshUser)
	return c, term, err
}

// startStoppable is start, also returning what stops the server's context (klient stopping).
func startStoppable(t *testing.T, sshUser string) (*ssh.Client, *webterm.Manager, context.CancelFunc, error) {
	t.Helper()
	me, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	signer, err := sshserver.LoadHostKey(filepath.Join(t.TempDir(), sshserver.HostKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	term, err := webterm.New(webterm.Options{Owner: me.Username})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(term.Close)
	srv, err := sshserver.New(sshserver.Options{HostKey: signer, Terminals: term})
	if err != nil {
		t.Fatal(err)
	}
	// A real TCP connection on the loopback (net.Pipe cannot carry both sides' version lines
	// at once): a stands for the tunnel klient serves, b for the client's end.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	a, err := ln.Accept()
	ln.Close()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() {
		defer close(served)
		srv.Serve(ctx, a, sshserver.ConnInfo{User: "alice", Account: me.Username})
	}()
	t.Cleanup(func() { cancel(); b.Close(); <-served })
	cfg := &ssh.ClientConfig{User: sshUser, HostKeyCallback: ssh.FixedHostKey(signer.PublicKey()), Timeout: 30 * time.Second}
	sc, chans, reqs, err := ssh.NewClientConn(b, "kloud--test", cfg)
	if err != nil {
		return nil, term, cancel, err
	}
	c := ssh.NewClient(sc, chans, reqs)
	t.Cleanup(func() { c.Close() })
	return c, term, cancel, nil
}

func account(t *testing.T) string {
	me, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	return me.Username
}

func TestAuthAcceptsOnlyTheAccount(t *testing.T) {
	if _, _, err := start(t, account(t)); err != nil {
		t.Fatalf("the connection's account: %v", err)
	}
	if _, _, err := start(t, "someone-else"); err == nil {
		t.Fatal("another SSH user name was accepted")
	}
}

func TestExec(t *testing.T) {
	c, _, err := start(t, account(t))
	if err != nil {
		t.Fatal(err)
	}
	s, _ := c.NewSession()
	out, err := s.Output("echo hi; echo err >&2")
	if err != nil || string(out) != "hi\n" {
		t.Fatalf("echo hi: %q %v", out, err)
	}
	s, _ = c.NewSession()
	var ee *ssh.ExitError
	if err := s.Run("exit 3"); !errors.As(err, &ee) || ee.ExitStatus() != 3 {
		t.Fatalf("exit 3: %v", err)
	}
	s, _ = c.NewSession()
	s.Stdin = strings.NewReader("piped\n")
	if out, err := s.Output("cat"); err != nil || string(out) != "piped\n" {
		t.Fatalf("cat: %q %v", out, err)
	}
	s, _ = c.NewSession()
	if err := s.Run("kill -TERM $$"); !errors.As(err, &ee) || ee.Signal() != "TERM" {
		t.Fatalf("a command killed by SIGTERM: %v", err)
	}
}

func TestEnvFiltered(t *testing.T) {
	c, _, err := start(t, account(t))
	if err != nil {
		t.Fatal(err)
	}
	s, _ := c.NewSession()
	if err := s.Setenv("LC_TIME", "C.UTF-8"); err != nil {
		t.Errorf("LC_TIME refused: %v", err)
	}
	for _, k := range []string{"LD_PRELOAD", "PATH", "BASH_ENV", "HOME"} {
		if err := s.Setenv(k, "/tmp/evil"); err == nil {
			t.Errorf("env %s accepted", k)
		}
	}
	out, err := s.Output("echo $LC_TIME:$LD_PRELOAD:$BASH_ENV")
	if err != nil || string(out) != "C.UTF-8::\n" {
		t.Fatalf("env: %q %v", out, err)
	}
	for name, want := range map[string]bool{"LANG": true, "LC_ALL": true, "TERM": true, "GIT_PROTOCOL": true, "LC_": false, "LD_LIBRARY_PATH": false, "SSH_AUTH_SOCK": false} {
		if sshserver.SafeEnv(name) != want {
			t.Errorf("SafeEnv(%s) = %v", name, !want)
		}
	}
}

func TestRefused(t *testing.T) {
	c, _, err := start(t, account(t))
	if err != nil {
		t.Fatal(err)
	}
	// ssh -R
	if ok, _, err := c.SendRequest("tcpip-forward", true, ssh.Marshal(struct {
		Addr string
		Port uint32
	}{"127.0.0.1", 0})); ok || err != nil {
		t.Errorf("tcpip-forward: ok %v, %v", ok, err)
	}
	s, _ := c.NewSession()
	if ok, err := s.SendRequest("auth-agent-req@openssh.com", true, nil); ok || err != nil {
		t.Errorf("agent forwarding: ok %v, %v", ok, err)
	}
	if ok, err := s.SendRequest("x11-req", true, nil); ok || err != nil {
		t.Errorf("x11 forwarding: ok %v, %v", ok, err)
	}
	if err := s.RequestSubsystem("sftp"); err == nil {
		t.Error("sftp without Options.SFTP was accepted")
	}
	// ssh -L elsewhere than this machine
	if conn, err := c.Dial("tcp", "192.0.2.1:80"); err == nil {
		conn.Close()
		t.Error("direct-tcpip to another host was accepted")
	}
	if _, _, err := c.OpenChannel("x11", nil); err == nil {
		t.Error("an x11 channel was accepted")
	}
}

func TestDirectTCPIP(t *testing.T) {
	c, _, err := start(t, account(t))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		s, err := ln.Accept()
		if err == nil {
			io.Copy(s, s)
			s.Close()
		}
	}()
	conn, err := c.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("direct-tcpip to the loopback: %v", err)
	}
	defer conn.Close()
	conn.Write([]byte("echo me"))
	buf := make([]byte, 7)
	if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "echo me" {
		t.Fatalf("through ssh -L: %q %v", buf, err)
	}
}

// ptyShell starts a login shell with a pty on c: its session, input and output.
func ptyShell(t *testing.T, c *ssh.Client) (*ssh.Session, io.Writer, *testutil.SyncBuffer) {
	t.Helper()
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.RequestPty("xterm", 24, 80, ssh.TerminalModes{}); err != nil {
		t.Fatal(err)
	}
	in, err := s.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out := new(testutil.SyncBuffer)
	s.Stdout = out
	if err := s.Shell(); err != nil {
		t.Fatal(err)
	}
	return s, in, out
}

// TestShellIsATerminalSession: a shell with a pty is a web terminal session (listed), ended
// when the SSH channel closes.
func TestShellIsATerminalSession(t *testing.T) {
	c, term, err := start(t, account(t))
	if err != nil {
		t.Fatal(err)
	}
	s, in, out := ptyShell(t, c)
	in.Write([]byte("echo $((40+2))-$KLOUD_SESSION\n"))
	testutil.Eventually(t, 30*time.Second, func() bool { return strings.Contains(out.String(), "42-ssh-") }, "the shell's answer")
	if l := term.List(); len(l) != 1 || !strings.HasPrefix(l[0].Session, "ssh-") || l[0].CreatedBy != "alice" {
		t.Fatalf("sessions while the shell is open: %+v", l)
	}
	in.Write([]byte("exit 5\n"))
	var ee *ssh.ExitError
	if err := s.Wait(); !errors.As(err, &ee) || ee.ExitStatus() != 5 {
		t.Errorf("the shell's exit: %v", err)
	}
	testutil.Eventually(t, 30*time.Second, func() bool { return len(term.List()) == 0 }, "the session gone")
}

// TestShellStaysWhenKlientStops: when klient stops (its context ends: a restart, an upgrade),
// a shell's SSH connection ends but its session stays, for the new klient to find in its
// holder and `kloud ssh --session` to reattach; a client that leaves ends it (above).
func TestShellStaysWhenKlientStops(t *testing.T) {
	c, term, stop, err := startStoppable(t, account(t))
	if err != nil {
		t.Fatal(err)
	}
	s, in, out := ptyShell(t, c)
	in.Write([]byte("echo $((40+2))\n"))
	testutil.Eventually(t, 30*time.Second, func() bool { return strings.Contains(out.String(), "42") }, "the shell's answer")
	stop()
	s.Wait() // the connection ends
	l := term.List()
	if len(l) != 1 || !strings.HasPrefix(l[0].Session, "ssh-") {
		t.Fatalf("sessions after klient stopped: %+v", l)
	}
	v, _, err := term.Open(webterm.OpenRequest{Session: l[0].Session, User: "alice", Mode: webterm.ModeAttach, Cols: 80, Rows: 24})
	if err != nil {
		t.Fatalf("reattach: %v", err)
	}
	defer v.Close()
	if err := v.Input([]byte("echo again-$((6*7))\n")); err != nil {
		t.Fatal(err)
	}
	var got strings.Builder
	buf := make([]byte, 4096)
	testutil.Eventually(t, 30*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		defer cancel()
		n, _ := v.Next(ctx, buf)
		got.Write(buf[:n])
		return strings.Contains(got.String(), "again-42")
	}, "the reattached shell's answer")
	term.Kill(l[0].Session, "test done")
}
