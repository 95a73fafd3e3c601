// Command ssh measures scp through kloud (issue 22: "scp throughput vs the same copy over the
// bridge to the machine's own address, target ≥ 0.8×"). Both sides are the real OpenSSH scp
// (SFTP protocol) against the same SSH server, klient's (klient/sshserver), in a real local
// machine (providers/local's sandbox library, booted from the base image):
//
//   - through kloud: `kloud config-ssh` writes the ssh config, scp's ProxyCommand is `kloud ssh
//     --stdio`: this host → kloud (on the bridge's host address) → the machine's klient over
//     its agent tunnel → klient's SSH server;
//   - baseline: the same SSH server code (this program in the machine, serving
//     klient/sshserver on a TCP port), reached directly at the machine's bridge address: what
//     a sshd on the machine would give, with no relay.
//
// It copies -mb MB up and down, -runs times per side, and prints the best throughput of each
// and the ratio (through kloud / baseline). Exit 1 when the upload ratio is under -target.
// kloud runs in its own process (bench/internal/kloudchild), klient in the machine, as in
// production. Needs root, the base image, ssh and scp; without them it says so and skips.
//
//	set -a && . /var/cache/kloud/env && set +a && go run ./bench/ssh [-mb 100] [-runs 3]
package main

import (
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/kloud-dev/kloud/bench/internal/benchvm"
	"github.com/kloud-dev/kloud/bench/internal/kloudchild"
	"github.com/kloud-dev/kloud/bench/internal/measure"
	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/klient/sshserver"
	"github.com/kloud-dev/kloud/klient/webterm"
	"github.com/kloud-dev/kloud/kloud/cli"
	"github.com/kloud-dev/kloud/providers/local/sandbox"
)

// directPort is where the baseline SSH server listens in the machine.
const directPort = 2222

func main() {
	sandbox.MaybeRunInit() // a local machine's launcher and PID 1 are this binary
	kloudchild.MaybeRun()
	switch {
	case len(os.Args) == 2 && os.Args[1] == "sftp-server": // the baseline's sftp, as the account
		if err := sshserver.ServeSFTP(os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	case len(os.Args) == 4 && os.Args[1] == "serve-ssh": // the baseline server, in the machine
		if err := serveSSH(os.Args[2], os.Args[3]); err != nil {
			fmt.Fprintln(os.Stderr, "ssh serve:", err)
			os.Exit(2)
		}
		return
	}
	mb := flag.Int("mb", 100, "MB copied per run")
	runs := flag.Int("runs", 3, "copies per side and direction")
	target := flag.Float64("target", 0.8, "the upload ratio under which it exits 1")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ratio, err := run(ctx, *mb, *runs)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ssh:", err)
		os.Exit(2)
	}
	if ratio > 0 && ratio < *target {
		fmt.Printf("MISSED: ratio %.2f < target %.2f\n", ratio, *target)
		os.Exit(1)
	}
}

// serveSSH serves klient's SSH server on addr, every connection as account (the baseline).
func serveSSH(addr, account string) error {
	dir, err := os.MkdirTemp("", "bench-ssh-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	signer, err := sshserver.LoadHostKey(filepath.Join(dir, sshserver.HostKeyFile))
	if err != nil {
		return err
	}
	term, err := webterm.New(webterm.Options{Owner: account})
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	srv, err := sshserver.New(sshserver.Options{HostKey: signer, Terminals: term,
		SFTP: func() *exec.Cmd { return &exec.Cmd{Path: self, Args: []string{"ssh", "sftp-server"}} }})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go srv.Serve(context.Background(), c, sshserver.ConnInfo{User: account, Account: account})
	}
}

func run(ctx context.Context, mb, runs int) (ratio float64, err error) {
	skip := func(why error) (float64, error) {
		fmt.Printf("SKIPPED: %v\n", why)
		return 0, nil
	}
	for _, b := range []string{"ssh", "scp"} {
		if _, err := exec.LookPath(b); err != nil {
			return skip(fmt.Errorf("%s is not installed (openssh-client)", b))
		}
	}
	work, err := os.MkdirTemp("/var/tmp", "kloud-bench-ssh-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(work)
	root, err := testutil.ModuleRoot()
	if err != nil {
		return 0, err
	}
	klient, kloudBin := filepath.Join(work, "klient"), filepath.Join(work, "kloud")
	for bin, pkg := range map[string]string{klient: "./cmd/klient", kloudBin: "./cmd/kloud"} {
		if err := kloudchild.GoBuild(root, bin, pkg); err != nil {
			return 0, err
		}
	}
	self, err := os.Executable()
	if err != nil {
		return 0, err
	}
	fmt.Printf("CPU: %s, %d vCPUs; load %s\n", measure.CPUModel(), runtime.NumCPU(), measure.LoadAvg())
	vm, err := benchvm.Boot(ctx, benchvm.Options{ID: "bench-ssh", Work: filepath.Join(work, "vm"), Bridge: "kdbs", Subnet: 170,
		Files: map[string]string{klient: "klient", self: "ssh"}})
	var skipErr *benchvm.SkipError
	if errors.As(err, &skipErr) {
		return skip(err)
	}
	if err != nil {
		return 0, err
	}
	defer vm.Close()
	kc, in, subnet := vm.Kloud, vm.Info, vm.Subnet
	owner := kloudchild.Owner
	if out, err := vm.Exec(ctx, "useradd", "-m", "-s", "/bin/bash", owner); err != nil {
		return 0, fmt.Errorf("useradd %s: %w: %s", owner, err, out)
	}
	for _, cmd := range []string{
		fmt.Sprintf("/opt/bench/ssh serve-ssh 0.0.0.0:%d %s", directPort, owner),
		fmt.Sprintf("/opt/bench/klient --kite-key /opt/bench/kite.key --kontrol-url %s/kite --owner %s", kc.URL, owner),
	} {
		if err := vm.Background(ctx, cmd, "/var/log/bench-ssh.log"); err != nil {
			return 0, err
		}
	}

	// Through kloud: the ssh config `kloud config-ssh` writes, once klient reported its key.
	session := filepath.Join(work, "session")
	if err := os.WriteFile(session, []byte(kc.Session), 0o600); err != nil {
		return 0, err
	}
	cfg := filepath.Join(work, "ssh_config")
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(300 * time.Millisecond) {
		out, err := exec.CommandContext(ctx, kloudBin, "--url", kc.URL, "--key", session, "config-ssh",
			"--ssh-config", cfg, "--known-hosts", filepath.Join(work, "known_hosts")).CombinedOutput()
		if err == nil && strings.Contains(string(out), "kloud--bench") {
			break
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("config-ssh: %v\n%s", err, out)
		}
	}
	direct := []string{"-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
		"-o", "BatchMode=yes", "-o", "Ciphers=" + cli.SSHCiphers, "-P", fmt.Sprint(directPort)} // the ciphers config-ssh writes
	viaKloud := []string{"-F", cfg, "-o", "BatchMode=yes"}
	directHost, kloudHost := owner+"@"+in.IP.String(), "kloud--bench"

	file := filepath.Join(work, "file")
	if err := writeRandom(file, int64(mb)*1000*1000); err != nil {
		return 0, err
	}
	back := filepath.Join(work, "back")
	scp := func(args []string, from, to string) (time.Duration, error) {
		t0 := time.Now()
		out, err := exec.CommandContext(ctx, "scp", append(slices.Clone(args), from, to)...).CombinedOutput()
		if err != nil {
			return 0, fmt.Errorf("scp %s %s: %w: %s", from, to, err, out)
		}
		return time.Since(t0), nil
	}
	// A first copy each way on each side (sessions, caches), not counted.
	for _, side := range []struct {
		args []string
		host string
	}{{direct, directHost}, {viaKloud, kloudHost}} {
		if _, err := scp(side.args, file, side.host+":/tmp/warm"); err != nil {
			return 0, err
		}
	}
	fmt.Printf("scp of %d MB, %d runs per side and direction: through kloud (%s) vs the same SSH server directly at %s:%d (bridge %s); load %s\n",
		mb, runs, kloudHost, in.IP, directPort, subnet, measure.LoadAvg())
	var up, down [2][]float64
	for range runs {
		for side, s := range []struct {
			args []string
			host string
		}{{direct, directHost}, {viaKloud, kloudHost}} {
			d, err := scp(s.args, file, s.host+":/tmp/file")
			if err != nil {
				return 0, err
			}
			up[side] = append(up[side], float64(mb)/d.Seconds())
			if d, err = scp(s.args, s.host+":/tmp/file", back); err != nil {
				return 0, err
			}
			down[side] = append(down[side], float64(mb)/d.Seconds())
		}
	}
	best := slices.Max[[]float64]
	ratio = best(up[1]) / best(up[0])
	fmt.Printf("upload (best of %d): direct %.0f MB/s, through kloud %.0f MB/s: ratio %.2f (runs: direct %.0f, kloud %.0f)\n",
		runs, best(up[0]), best(up[1]), ratio, up[0], up[1])
	fmt.Printf("download (best of %d): direct %.0f MB/s, through kloud %.0f MB/s: ratio %.2f (runs: direct %.0f, kloud %.0f); load %s\n",
		runs, best(down[0]), best(down[1]), best(down[1])/best(down[0]), down[0], down[1], measure.LoadAvg())
	return ratio, nil
}

func writeRandom(path string, n int64) error {
	b := make([]byte, n)
	rand.Read(b)
	return os.WriteFile(path, b, 0o600)
}
