// Package kloudchild runs the kloud of a benchmark in a process of its own (the benchmark's
// program re-executed), as in production: one machine record of user Owner whose agent is a
// klient the benchmark starts with the kite key written for it, and a session for Owner that
// a browser-like client uses. Call MaybeRun first in main, then Start (bench/webterm,
// bench/ports).
package kloudchild

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/provider"
)

// The benchmark's user and machine.
const (
	Owner     = "bench"
	MachineID = "0000000000000000000be4c1" // an id as kloud makes them (24 hex digits: kloud ssh --stdio takes it as an id)
)

// childArg is argv[1] of the child process.
const childArg = "kloud-child"

// MaybeRun runs kloud and exits when this process is a child Start started; else it returns.
func MaybeRun() {
	if len(os.Args) != 4 || os.Args[1] != childArg {
		return
	}
	if err := child(os.Args[2], os.Args[3]); err != nil {
		fmt.Fprintln(os.Stderr, "bench kloud:", err)
		os.Exit(2)
	}
	os.Exit(0)
}

// Kloud is the running child.
type Kloud struct {
	URL     string // http://host:port
	Session string // Owner's session (Authorization: Bearer)
	KiteKey string // file with the kite key of MachineID's agent (klient --kite-key)
	cmd     *exec.Cmd
}

// Start re-executes this program as kloud with data directory dir (created, 0700), listening on
// listen ("127.0.0.1:0"; an address machines reach when the agent runs in one), and waits until
// it serves. Stop it with Stop.
func Start(ctx context.Context, dir, listen string) (*Kloud, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, self, childArg, dir, listen)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	k := &Kloud{cmd: cmd, KiteKey: filepath.Join(dir, "kite.key")}
	line, err := bufio.NewReader(out).ReadString('\n')
	url, found := strings.CutPrefix(strings.TrimSpace(line), "READY ")
	if err != nil || !found {
		k.Stop()
		return nil, fmt.Errorf("kloud child: %q %v", line, err)
	}
	session, err := os.ReadFile(filepath.Join(dir, "session"))
	if err != nil {
		k.Stop()
		return nil, err
	}
	k.URL, k.Session = url, strings.TrimSpace(string(session))
	return k, nil
}

// Stop interrupts kloud and waits for it to exit.
func (k *Kloud) Stop() {
	k.cmd.Process.Signal(os.Interrupt)
	k.cmd.Wait()
}

// StartKlient starts klient binary bin on this host as MachineID's agent, for Owner, with the
// machine's files under root and its state in stateDir; its output is dropped. Stop it with
// StopProcess.
func (k *Kloud) StartKlient(ctx context.Context, bin, root, stateDir string) (*exec.Cmd, error) {
	cmd := exec.CommandContext(ctx, bin, "--kite-key", k.KiteKey, "--kontrol-url", k.URL+"/kite",
		"--owner", Owner, "--root", root, "--state-dir", stateDir)
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	return cmd, cmd.Start()
}

// StopProcess interrupts a process a benchmark started and waits for it.
func StopProcess(cmd *exec.Cmd) {
	cmd.Process.Signal(os.Interrupt)
	cmd.Wait()
}

// child is the kloud process: it prints "READY <url>" once it has written the agent's kite key
// and Owner's session into dir, and serves until interrupted.
func child(dir, listen string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	url := "http://" + ln.Addr().String()
	s, err := kloud.New(ctx, kloud.Options{DataDir: dir, Addr: ln.Addr().String(), PublicURL: url, KlientBin: "/nonexistent",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return err
	}
	key, kiteID, err := s.Kontrol.CreateKey(Owner, kloud.AgentKitePrefix+"bench")
	if err != nil {
		return err
	}
	if err := kitekey.WriteFile(filepath.Join(dir, "kite.key"), key); err != nil {
		return err
	}
	now := s.Store().Now()
	if err := s.Store().Machines().InsertMany(ctx, []model.Machine{{
		ID: MachineID, StackID: "bench", Label: "bench", Provider: "none", Owner: Owner, Team: model.DefaultTeam,
		State: provider.Running, KiteID: kiteID, CreatedAt: now, UpdatedAt: now,
	}}); err != nil {
		return err
	}
	sess, err := s.Signer().Session(Owner, false, time.Hour)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "session"), []byte(sess), 0o600); err != nil {
		return err
	}
	fmt.Println("READY " + url)
	if err := s.ServeListener(ctx, ln); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// GoBuild builds the Go package pkg into the binary out, in directory dir (the module root, or a
// tools module below it): the binaries a benchmark runs beside its kloud (klient, gotty).
func GoBuild(dir, out, pkg string) error {
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = dir
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", pkg, err, b)
	}
	return nil
}
