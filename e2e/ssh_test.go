package e2e

// SSH for every tool (issue 22 §1) on a real local machine: `kloud config-ssh` writes a
// temporary ssh config, then the real OpenSSH client tools (/usr/bin/ssh, scp, sftp, rsync)
// and git reach the machine through kloud's relay and the klient's SSH server: exec, a pty,
// 100 MB both ways with scp and rsync, sftp, git push/clone/pull, ssh -L, a tampered
// known_hosts refused, a read-only share refused, a revoked share's open session closed at
// once. The scp throughput is compared with a plain TCP copy of the same file to the machine's
// bridge address (printed). Needs root, the base image, ssh, scp, sftp, rsync and git (skips
// loudly otherwise, fails under CI=true).

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/kloud-dev/kloud/internal/testutil"
)

func TestLocalSSH(t *testing.T) {
	for _, b := range []string{"ssh", "scp", "sftp", "rsync", "git"} {
		testutil.RequireBinary(t, b)
	}
	e := newLocalEnv(t)
	keys := e.members("ssh-pass-1", "alice", "bob", "dave")
	marker := "kloud-ssh-" + randomWord()
	serve := "#!/bin/bash\nmkdir -p /srv/www && echo " + marker + " > /srv/www/index.html\n" +
		"setsid python3 -m http.server 8000 --bind 127.0.0.1 --directory /srv/www >/dev/null 2>&1 < /dev/null &"
	e.key = keys["alice"]
	sid := e.createStack(e.template(localTemplate("dev", 1, serve)))
	e.apply(sid)
	dev := e.machines(sid)["dev.0"]
	// The build kept the host key the agent reported (what config-ssh pins).
	if out := e.run("machine", "info", "dev.0", "--stack", sid, "--json"); !strings.Contains(out, `"sshHostKey": "ssh-ed25519 `) {
		t.Errorf("machine info after the build has no ssh host key:\n%s", out)
	}
	e.run("machine", "share", "dev.0", "bob", "--grant", "terminal", "--stack", sid)
	e.run("machine", "share", "dev.0", "dave", "--grant", "readonly", "--stack", sid)

	dir := t.TempDir()
	configSSH := func(user string, args ...string) (cfg, out string) {
		cfg = filepath.Join(dir, user+".config")
		e.key = keys[user]
		out = e.run(append([]string{"config-ssh", "--ssh-config", cfg, "--known-hosts", filepath.Join(dir, user+".known_hosts")}, args...)...)
		return cfg, out
	}
	// The user's own lines around the block stay as they are.
	aliceCfg := filepath.Join(dir, "alice.config")
	mine := "Host example\n  User nobody\n"
	os.WriteFile(aliceCfg, []byte(mine), 0o600)
	cfg, out := configSSH("alice")
	if !strings.Contains(out, "ssh kloud--dev.0") {
		t.Fatalf("config-ssh:\n%s", out)
	}
	first, _ := os.ReadFile(cfg)
	if _, out = configSSH("alice"); !strings.Contains(out, "up to date") {
		t.Errorf("config-ssh again:\n%s", out)
	}
	if again, _ := os.ReadFile(cfg); !bytes.Equal(again, first) {
		t.Errorf("config-ssh twice changed the file:\n%s\n---\n%s", first, again)
	}
	if _, out = configSSH("alice", "--dry-run"); out != "" {
		t.Errorf("config-ssh --dry-run with nothing to change printed:\n%s", out)
	}
	t.Logf("ssh config:\n%s", first)

	sshArgs := func(cfg string, args ...string) []string {
		return append([]string{"-F", cfg, "-o", "BatchMode=yes"}, args...)
	}
	run := func(cfg string, stdin string, args ...string) (string, error) {
		cmd := exec.CommandContext(t.Context(), "ssh", sshArgs(cfg, args...)...)
		cmd.Stdin = strings.NewReader(stdin)
		b, err := cmd.CombinedOutput()
		return string(b), err
	}
	mustRun := func(cfg, stdin string, args ...string) string {
		t.Helper()
		out, err := run(cfg, stdin, args...)
		if err != nil {
			t.Fatalf("ssh %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}

	// exec, its exit status, the account it runs as.
	if out := mustRun(cfg, "", "kloud--dev.0", "echo", "hi"); strings.TrimSpace(out) != "hi" {
		t.Errorf("ssh echo hi: %q", out)
	}
	if out := mustRun(cfg, "", "kloud--dev.0", "whoami"); strings.TrimSpace(out) != "alice" {
		t.Errorf("ssh whoami as the owner: %q", out)
	}
	if _, err := run(cfg, "", "kloud--dev.0", "exit 7"); exitCode(err) != 7 {
		t.Errorf("ssh 'exit 7': %v", err)
	}
	// stdin reaches the command; env outside the safe set does not.
	if out := mustRun(cfg, "through stdin\n", "kloud--dev.0", "cat"); out != "through stdin\n" {
		t.Errorf("ssh cat: %q", out)
	}
	// An interactive pty: a login shell (a web terminal session), and a command on a pty.
	if out := mustRun(cfg, "tty; echo done-$((6*7))\nexit\n", "-tt", "kloud--dev.0"); !strings.Contains(out, "/dev/pts/") || !strings.Contains(out, "done-42") {
		t.Errorf("ssh -tt (shell):\n%s", out)
	}
	if out := mustRun(cfg, "", "-tt", "kloud--dev.0", "tty"); !strings.Contains(out, "/dev/pts/") {
		t.Errorf("ssh -tt tty:\n%s", out)
	}

	// 100 MiB both ways with scp, 16 MiB with rsync; checksums equal.
	big := filepath.Join(dir, "big")
	writeRandom(t, big, 100<<20)
	sum := fileSum(t, big)
	remoteSum := func(path string) string {
		out := mustRun(cfg, "", "kloud--dev.0", "sha256sum", path)
		f, _, _ := strings.Cut(out, " ")
		return f
	}
	timed := func(name string, args ...string) time.Duration {
		t.Helper()
		start := time.Now()
		cmd := exec.CommandContext(t.Context(), name, args...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return time.Since(start)
	}
	up := timed("scp", "-F", cfg, "-o", "BatchMode=yes", big, "kloud--dev.0:/tmp/big")
	if got := remoteSum("/tmp/big"); got != sum {
		t.Fatalf("scp up: sha256 %s on the machine, %s here", got, sum)
	}
	back := filepath.Join(dir, "back")
	down := timed("scp", "-F", cfg, "-o", "BatchMode=yes", "kloud--dev.0:/tmp/big", back)
	if got := fileSum(t, back); got != sum {
		t.Fatalf("scp down: sha256 %s, want %s", got, sum)
	}
	// rsync with a smaller file (16 MiB: its path is the same as scp's; the suite's time is
	// not spent twice on 100 MiB).
	mid := filepath.Join(dir, "mid")
	writeRandom(t, mid, 16<<20)
	smallSum := fileSum(t, mid)
	rsh := "ssh -F " + cfg + " -o BatchMode=yes"
	rup := timed("rsync", "-e", rsh, mid, "kloud--dev.0:/tmp/big2")
	if got := remoteSum("/tmp/big2"); got != smallSum {
		t.Fatalf("rsync up: sha256 %s on the machine, %s here", got, sum)
	}
	back2 := filepath.Join(dir, "back2")
	rdown := timed("rsync", "-e", rsh, "kloud--dev.0:/tmp/big2", back2)
	if got := fileSum(t, back2); got != smallSum {
		t.Fatalf("rsync down: sha256 %s, want %s", got, sum)
	}
	mbps := func(d time.Duration) float64 { return 100 * 1.048576 / d.Seconds() }
	smallMBps := func(d time.Duration) float64 { return 16 * 1.048576 / d.Seconds() }
	t.Logf("through kloud: scp of 100 MiB up %.0f MB/s, down %.0f MB/s; rsync of 16 MiB up %.0f MB/s, down %.0f MB/s", mbps(up), mbps(down), smallMBps(rup), smallMBps(rdown))

	// The baseline: the same file over plain TCP to the machine's own bridge address, into a
	// file there (python3 receiving), as scp writes one.
	if dev.IPAddress != "" {
		port := "7109"
		recv := "import socket,sys\ns=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);s.bind(('0.0.0.0'," + port + "));s.listen(1)\nc,_=s.accept()\nf=open('/tmp/big3','wb')\nwhile True:\n  b=c.recv(1<<20)\n  if not b: break\n  f.write(b)\nf.close();c.close()\n"
		mustRun(cfg, recv, "kloud--dev.0", "cat > /tmp/recv.py && (setsid python3 /tmp/recv.py >/dev/null 2>&1 </dev/null &)")
		var c net.Conn
		testutil.Eventually(t, 10*time.Second, func() bool {
			var err error
			c, err = net.DialTimeout("tcp", net.JoinHostPort(dev.IPAddress, port), time.Second)
			return err == nil
		}, "the receiver on the machine's bridge address")
		f, _ := os.Open(big)
		start := time.Now()
		_, err := io.Copy(c, f)
		f.Close()
		c.(*net.TCPConn).CloseWrite()
		io.Copy(io.Discard, c) // until the receiver closed: it wrote everything
		c.Close()
		plain := time.Since(start)
		if err != nil {
			t.Fatalf("plain TCP copy: %v", err)
		}
		if got := remoteSum("/tmp/big3"); got != sum {
			t.Fatalf("plain TCP copy: sha256 %s, want %s", got, sum)
		}
		t.Logf("100 MiB plain TCP to %s (bridge): %.0f MB/s; scp through kloud up is %.2f× of it", dev.IPAddress, mbps(plain), plain.Seconds()/up.Seconds())
	}

	// sftp put and get.
	small := filepath.Join(dir, "small")
	os.WriteFile(small, []byte(marker+"\n"), 0o644)
	batch := filepath.Join(dir, "batch")
	os.WriteFile(batch, []byte("put "+small+" /tmp/small\nget /tmp/small "+small+".back\nls -l /tmp/small\n"), 0o644)
	if out, err := exec.CommandContext(t.Context(), "sftp", "-F", cfg, "-o", "BatchMode=yes", "-b", batch, "kloud--dev.0").CombinedOutput(); err != nil {
		t.Fatalf("sftp: %v\n%s", err, out)
	}
	if b, _ := os.ReadFile(small + ".back"); string(b) != marker+"\n" {
		t.Errorf("sftp get: %q", b)
	}
	if out := mustRun(cfg, "", "kloud--dev.0", "stat -c %U /tmp/small"); strings.TrimSpace(out) != "alice" {
		t.Errorf("the file sftp put belongs to %q, want alice", out)
	}

	// git over SSH, driven by this host's git: a bare repository made on the machine, a push to
	// it, a clone back; then a second commit pushed and fetched into the clone (the incremental
	// path). The machine's git serves both ends (git-receive-pack, git-upload-pack).
	gitStart := time.Now()
	gitEnv := append(os.Environ(),
		"GIT_SSH_COMMAND=ssh -F '"+cfg+"' -o BatchMode=yes",
		"GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1", "GIT_TERMINAL_PROMPT=0",
		"GIT_AUTHOR_NAME=Alice", "GIT_AUTHOR_EMAIL=alice@example.com",
		"GIT_COMMITTER_NAME=Alice", "GIT_COMMITTER_EMAIL=alice@example.com")
	git := func(extraEnv []string, args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(t.Context(), "git", args...)
		cmd.Env = append(gitEnv, extraEnv...)
		b, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, b)
		}
		return string(b)
	}
	repo := "proj-" + randomWord() + ".git" // in alice's home on the machine
	mustRun(cfg, "", "kloud--dev.0", "git", "init", "--bare", "-q", "-b", "main", repo)
	src, clone := filepath.Join(dir, "src"), filepath.Join(dir, "clone")
	git(nil, "init", "-q", "-b", "main", src)
	os.WriteFile(filepath.Join(src, "README"), []byte(marker+"\n"), 0o644)
	git(nil, "-C", src, "add", "README")
	git(nil, "-C", src, "commit", "-q", "-m", "first")
	head := func(repo string) string { return strings.TrimSpace(git(nil, "-C", repo, "rev-parse", "HEAD")) }
	git(nil, "-C", src, "push", "-q", "kloud--dev.0:"+repo, "main")
	if got, want := strings.TrimSpace(mustRun(cfg, "", "kloud--dev.0", "git", "-C", repo, "rev-parse", "main")), head(src); got != want {
		t.Errorf("after git push the machine's main is %q, want %q", got, want)
	}
	if out := mustRun(cfg, "", "kloud--dev.0", "stat -c %U "+repo+"/objects"); strings.TrimSpace(out) != "alice" {
		t.Errorf("the pushed repository belongs to %q, want alice", out)
	}
	// git asks for protocol v2 with ssh's SendEnv=GIT_PROTOCOL; the machine's git answers in it
	// when the env request was accepted (GIT_TRACE_PACKET shows the exchange).
	if out := git([]string{"GIT_TRACE_PACKET=1"}, "clone", "-q", "kloud--dev.0:"+repo, clone); !strings.Contains(out, "< version 2") {
		t.Errorf("git clone over SSH did not speak protocol v2:\n%s", out)
	}
	if got, want := head(clone), head(src); got != want {
		t.Errorf("the clone's HEAD is %s, the pushed commit %s", got, want)
	}
	if b, _ := os.ReadFile(filepath.Join(clone, "README")); string(b) != marker+"\n" {
		t.Errorf("the clone's README: %q", b)
	}
	os.WriteFile(filepath.Join(src, "README"), []byte(marker+" again\n"), 0o644)
	git(nil, "-C", src, "commit", "-q", "-a", "-m", "second")
	git(nil, "-C", src, "push", "-q", "kloud--dev.0:"+repo, "main")
	git(nil, "-C", clone, "pull", "-q", "--ff-only")
	if got, want := head(clone), head(src); got != want {
		t.Errorf("after a second push and a pull the clone's HEAD is %s, want %s", got, want)
	}
	t.Logf("git over SSH: init --bare, push, clone, push, pull in %v", time.Since(gitStart).Round(time.Millisecond))

	// ssh -L to the server on the machine's loopback.
	local := testutil.FreeLoopback(t)
	fwd := exec.CommandContext(t.Context(), "ssh", sshArgs(cfg, "-N", "-L", local+":127.0.0.1:8000", "kloud--dev.0")...)
	if err := fwd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fwd.Process.Kill(); fwd.Wait() })
	var body []byte
	testutil.Eventually(t, 30*time.Second, func() bool {
		resp, err := http.Get("http://" + local + "/index.html")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, _ = io.ReadAll(resp.Body)
		return strings.Contains(string(body), marker)
	}, "the web server through ssh -L")
	fwd.Process.Kill()
	fwd.Wait()
	// ssh -L elsewhere than the machine itself is refused.
	if out, err := run(cfg, "", "-o", "ExitOnForwardFailure=yes", "-W", "192.0.2.1:80", "kloud--dev.0"); err == nil {
		t.Errorf("ssh -W to another host went through:\n%s", out)
	}

	// A tampered known_hosts: the host key does not match, ssh refuses.
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	other, _ := ssh.NewPublicKey(pub)
	badKnown := filepath.Join(dir, "bad_known_hosts")
	os.WriteFile(badKnown, []byte("kloud--dev.0 "+string(ssh.MarshalAuthorizedKey(other))), 0o600)
	badCfg := filepath.Join(dir, "bad.config")
	os.WriteFile(badCfg, bytes.ReplaceAll(first, []byte(filepath.Join(dir, "alice.known_hosts")), []byte(badKnown)), 0o600)
	if out, err := run(badCfg, "", "kloud--dev.0", "echo", "hi"); err == nil || !strings.Contains(out, "REMOTE HOST IDENTIFICATION HAS CHANGED") {
		t.Errorf("ssh with a tampered known_hosts: %v\n%s", err, out)
	}

	// A read-only share: config-ssh skips the machine; ssh --stdio is refused, saying why.
	if _, out := configSSH("dave"); !strings.Contains(out, "read-only") {
		t.Errorf("config-ssh of a read-only share:\n%s", out)
	}
	e.key = keys["dave"]
	if out, err := e.try("ssh", "--stdio", "kloud--"+dev.ID); err == nil || !strings.Contains(out, "read-only") {
		t.Errorf("ssh --stdio with a read-only share: %v\n%s", err, out)
	}

	// A machine that is not there: a clear error, a non-zero exit.
	if out, err := e.try("ssh", "--stdio", "kloud--nosuch"); err == nil || !strings.Contains(out, `no machine "nosuch"`) {
		t.Errorf("ssh --stdio kloud--nosuch: %v\n%s", err, out)
	}

	// A terminal share: its own account; its open session ends at once when it is revoked.
	bobCfg, _ := configSSH("bob")
	if out := mustRun(bobCfg, "", "kloud--dev.0", "whoami"); strings.TrimSpace(out) != "bob" {
		t.Errorf("ssh whoami as a terminal share: %q", out)
	}
	if b, _ := os.ReadFile(bobCfg); !bytes.Contains(b, []byte("User bob")) {
		t.Errorf("bob's ssh config:\n%s", b)
	}
	long := exec.CommandContext(t.Context(), "ssh", sshArgs(bobCfg, "-tt", "kloud--dev.0")...)
	var longErr testutil.SyncBuffer // ssh's, and its ProxyCommand's (kloud ssh --stdio)
	long.Stderr = &longErr
	stdin, _ := long.StdinPipe()
	stdout, _ := long.StdoutPipe()
	if err := long.Start(); err != nil {
		t.Fatal(err)
	}
	var exitedAt time.Time // set before exited is closed, by the one Wait
	exited := make(chan struct{})
	go func() { long.Wait(); exitedAt = time.Now(); close(exited) }()
	t.Cleanup(func() {
		long.Process.Kill()
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
		}
	})
	io.WriteString(stdin, "echo ready-$((1+1))\n")
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "ready-2") {
				ready <- true
				break
			}
		}
		io.Copy(io.Discard, stdout)
	}()
	select {
	case <-ready:
	case <-time.After(30 * time.Second):
		t.Fatal("bob's ssh shell never answered")
	}
	e.key = keys["alice"]
	unshare := time.Now()
	e.run("machine", "unshare", "dev.0", "bob", "--stack", sid)
	returned := time.Since(unshare)
	select {
	case <-exited:
		d := exitedAt.Sub(unshare)
		t.Logf("bob's ssh session closed %v after `kloud machine unshare` started (the command took %v)", d.Round(time.Millisecond), returned.Round(time.Millisecond))
		if d > returned+2*time.Second { // the target is 1 s after kloud changed the share; slack for a loaded host
			t.Errorf("bob's ssh session closed %v after the unshare started (it took %v)", d, returned)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("bob's ssh session is still open 10 s after the unshare")
	}
	if !strings.Contains(longErr.String(), "share with you changed") { // klient's reason, passed on by kloud
		t.Errorf("bob's ssh was not told why it closed:\n%s", longErr.String())
	}

	// A stopped machine keeps its entry: kloud kept the host key klient reported.
	e.run("machine", "stop", "dev.0", "--stack", sid)
	if _, out := configSSH("alice"); !strings.Contains(out, "up to date") {
		t.Errorf("config-ssh with the machine stopped:\n%s", out)
	}
	if again, _ := os.ReadFile(cfg); !bytes.Equal(again, first) {
		t.Errorf("config-ssh with the machine stopped changed the file:\n%s", again)
	}

	// --remove takes the block away and keeps the user's lines byte for byte.
	configSSH("alice", "--remove")
	if b, _ := os.ReadFile(cfg); string(b) != mine {
		t.Errorf("after --remove:\n%q, want %q", b, mine)
	}
	if _, err := os.Stat(filepath.Join(dir, "alice.known_hosts")); !os.IsNotExist(err) {
		t.Errorf("--remove left the known_hosts: %v", err)
	}
	e.run("stack", "destroy", sid)
}

func exitCode(err error) int {
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	if err == nil {
		return 0
	}
	return -1
}

// writeRandom writes n random bytes to path.
func writeRandom(t *testing.T, path string, n int64) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := io.CopyN(f, rand.Reader, n); err != nil {
		t.Fatal(err)
	}
}

func fileSum(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	io.Copy(h, f)
	return hex.EncodeToString(h.Sum(nil))
}
