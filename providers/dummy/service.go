package dummy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/provider/plugin"
)

// The boot service: what the generated terraform_data resources call (see the package doc).

// claims is what a build's token says: the stack, each machine label with the sha256 of the
// script kloud rendered for it, and until when it may boot them (unix seconds).
type claims struct {
	Stack    string            `json:"stack"`
	Machines map[string]string `json:"machines"`
	Exp      int64             `json:"exp"`
}

const (
	tokenPrefix = "kdt1."
	keyFile     = ".token.key" // in Dir; not a valid stack id, so never a machine directory
	maxScript   = 4 << 20
)

var (
	errToken   = plugin.ErrBootToken
	errExpired = errors.New("token expired")
)

// tokens returns the signer of the build tokens, its key in Dir (made on first use).
func (d *dummy) tokens() (*plugin.BootTokens, error) {
	if d.o.Dir == "" {
		return nil, errors.New("dummy: Options.Dir is not set")
	}
	if err := os.MkdirAll(d.o.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("dummy: %w", err)
	}
	d.tokensOnce.Do(func() {
		d.bootTokens = &plugin.BootTokens{Prefix: tokenPrefix, KeyFile: filepath.Join(d.o.Dir, keyFile)}
	})
	return d.bootTokens, nil
}

func (d *dummy) mint(c claims) (string, error) {
	t, err := d.tokens()
	if err != nil {
		return "", err
	}
	tok, err := t.Mint(c)
	if err != nil {
		return "", fmt.Errorf("dummy: %w", err)
	}
	return tok, nil
}

// verify checks the token's signature and, if checkExp, its expiry.
func (d *dummy) verify(token string, now time.Time, checkExp bool) (*claims, error) {
	t, err := d.tokens()
	if err != nil {
		return nil, err
	}
	var c claims
	if err := t.Verify(token, &c); err != nil {
		if errors.Is(err, plugin.ErrBootToken) {
			return nil, errToken
		}
		return nil, fmt.Errorf("dummy: %w", err)
	}
	if !plugin.ValidName(c.Stack) {
		return nil, errToken
	}
	if checkExp && now.Unix() >= c.Exp {
		return nil, errExpired
	}
	return &c, nil
}

func (d *dummy) handler() http.Handler {
	mux := http.NewServeMux()
	p := provider.HandlerPrefix(d.o.Name) + "v1/machines/{machine}/"
	mux.HandleFunc("POST "+p+"boot", d.serveBoot)
	mux.HandleFunc("POST "+p+"destroy", d.serveDestroy)
	return mux
}

// authorize returns the token's claims and the machine label of the request, or writes the
// refusal.
func (d *dummy) authorize(w http.ResponseWriter, r *http.Request, boot bool) (*claims, string, bool) {
	label := r.PathValue("machine")
	if !plugin.ValidName(label) {
		httpError(w, http.StatusBadRequest, fmt.Errorf("machine %q: not a machine label", label))
		return nil, "", false
	}
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		httpError(w, http.StatusUnauthorized, errors.New("no bearer token"))
		return nil, "", false
	}
	c, err := d.verify(strings.TrimSpace(tok), time.Now(), boot)
	if err != nil {
		httpError(w, http.StatusUnauthorized, err)
		return nil, "", false
	}
	if _, ok := c.Machines[label]; !ok {
		httpError(w, http.StatusForbidden, fmt.Errorf("machine %q is not a machine of this token's build of stack %s", label, c.Stack))
		return nil, "", false
	}
	return c, label, true
}

func (d *dummy) serveBoot(w http.ResponseWriter, r *http.Request) {
	c, label, ok := d.authorize(w, r, true)
	if !ok {
		return
	}
	script, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxScript))
	if err != nil {
		httpError(w, http.StatusBadRequest, fmt.Errorf("read script: %w", err))
		return
	}
	if plugin.ScriptSum(script) != c.Machines[label] {
		httpError(w, http.StatusForbidden, fmt.Errorf("machine %s: this is not the script kloud rendered for it", label))
		return
	}
	log := d.o.Logger.With("stack", c.Stack, "machine", label)
	if err := d.fail("Boot"); err != nil {
		httpError(w, http.StatusInternalServerError, err)
		return
	}
	// The boot outlives the request (curl may give up): it returns as soon as provisioning has
	// started in the background.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 2*time.Minute)
	defer cancel()
	unlock := d.lockMachine(d.root(c.Stack, label))
	err = d.boot(ctx, c.Stack, label, script)
	unlock()
	if err != nil {
		log.Warn("boot", "err", err)
		httpError(w, http.StatusInternalServerError, err)
		return
	}
	log.Info("booted", "root", d.root(c.Stack, label))
	writeJSON(w, http.StatusOK, map[string]any{"machine": label, "booted": true})
}

func (d *dummy) serveDestroy(w http.ResponseWriter, r *http.Request) {
	c, label, ok := d.authorize(w, r, false)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), time.Minute)
	defer cancel()
	unlock := d.lockMachine(d.root(c.Stack, label))
	err := d.destroy(ctx, c.Stack, label)
	unlock()
	if err != nil {
		d.o.Logger.Warn("destroy", "stack", c.Stack, "machine", label, "err", err)
		httpError(w, http.StatusInternalServerError, err)
		return
	}
	d.o.Logger.Info("destroyed", "stack", c.Stack, "machine", label)
	writeJSON(w, http.StatusOK, map[string]any{"machine": label, "destroyed": true})
}

// boot "powers on" a machine: its script (userdata.RenderScript's) runs with bash in this
// process, from a copy in the machine (like cloud-init's user-data.txt), and returns once
// provisioning runs in the background. A machine booted again is stopped and wiped first; one
// whose boot script fails is destroyed.
func (d *dummy) boot(ctx context.Context, stackID, label string, script []byte) (err error) {
	root := d.root(stackID, label)
	defer func() {
		if err == nil {
			return
		}
		// A failed boot leaves no half machine running until the stack is destroyed.
		if derr := d.destroy(context.WithoutCancel(ctx), stackID, label); derr != nil {
			d.o.Logger.Warn("clean up a failed boot", "stack", stackID, "machine", label, "err", derr)
		}
	}()
	// A machine booted again (its tainted boot replaced) is a new machine: nothing of the old
	// one runs or stays (the planner reads the whole console as this boot's).
	if err := killMachine(ctx, root); err != nil {
		return err
	}
	if err := os.RemoveAll(root); err != nil {
		return fmt.Errorf("boot %s: %w", label, err)
	}
	f := filepath.Join(root, "var/lib/cloud/instance/user-data.txt")
	if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
		return fmt.Errorf("boot %s: %w", label, err)
	}
	if err := os.WriteFile(f, script, 0o600); err != nil {
		return fmt.Errorf("boot %s: %w", label, err)
	}
	cmd := exec.CommandContext(ctx, "/bin/bash", f)
	cmd.Dir, cmd.Env = root, machineEnv(root)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 5 * time.Second // provisioning redirects its output; bound a straggler anyway
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("boot %s: %w: %s", label, err, tail(out.String(), 4096))
	}
	return d.fail("BootScript")
}

// destroy kills every process of the machine and removes its directory (and the stack's, once
// empty). Destroying a machine that is not there succeeds.
func (d *dummy) destroy(ctx context.Context, stackID, label string) error {
	root := d.root(stackID, label)
	if err := killMachine(ctx, root); err != nil {
		return fmt.Errorf("destroy %s: %w", label, err)
	}
	if err := os.RemoveAll(root); err != nil {
		return fmt.Errorf("destroy %s: %w", label, err)
	}
	os.Remove(filepath.Dir(root)) // fails while other machines of the stack are there
	return nil
}

// envMachine marks every process of a machine: boot and start give it to the machine's first
// process, and everything it starts inherits it (provisioning, klient's supervisor and klient,
// the user's script and what that starts), so killMachine finds them all, also those that are
// not yet in a pid file. A process that clears its environment escapes it (this is a test
// provider, not a container).
const envMachine = "KLOUD_DUMMY_MACHINE"

// machineEnv is the environment a machine's processes start with: no variable of kloud's.
func machineEnv(root string) []string {
	path := os.Getenv("PATH")
	if path == "" {
		path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	}
	return []string{"PATH=" + path, "HOME=/root", "LANG=C.UTF-8", envMachine + "=" + root}
}

// machineProcs returns the live processes (not zombies) whose environment marks them as the
// machine's at root.
func machineProcs(root string) []int {
	return markedProcs(func(r string) bool { return r == root })
}

// markedProcs returns the live processes (not zombies) whose environment marks them as a
// machine's whose root match accepts.
func markedProcs(match func(root string) bool) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	prefix := []byte(envMachine + "=")
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() || !running(pid) {
			continue
		}
		env, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err != nil {
			continue
		}
		for _, kv := range bytes.Split(env, []byte{0}) {
			if r, ok := bytes.CutPrefix(kv, prefix); ok && match(string(r)) {
				out = append(out, pid)
				break
			}
		}
	}
	return out
}

// killMachine ends every process of the machine at root: SIGTERM, up to 3 s to exit, then
// SIGKILL until none is left (a dying process may have started another meanwhile).
func killMachine(ctx context.Context, root string) error {
	return killMarked(ctx, root, func() []int { return machineProcs(root) })
}

// KillAll ends every process of every machine whose directory is under dir (Options.Dir), as
// killMachine does one machine's. Tests call it when they end, so that the machines of a test
// that failed before destroying its stack do not outlive it.
func KillAll(ctx context.Context, dir string) error {
	dir = filepath.Clean(dir) + string(filepath.Separator)
	return killMarked(ctx, dir, func() []int {
		return markedProcs(func(r string) bool { return strings.HasPrefix(r, dir) })
	})
}

// killMarked ends the processes procs finds (what names them): SIGTERM, up to 3 s to exit,
// then SIGKILL until none is left.
func killMarked(ctx context.Context, what string, procs func() []int) error {
	pids := procs()
	for _, pid := range pids {
		syscall.Kill(pid, syscall.SIGTERM)
	}
	wait := func(d time.Duration) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
			return nil
		}
	}
	for deadline := time.Now().Add(3 * time.Second); len(pids) > 0 && time.Now().Before(deadline); pids = procs() {
		if err := wait(20 * time.Millisecond); err != nil {
			return err
		}
	}
	for range 100 {
		if len(pids) == 0 {
			return nil
		}
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		if err := wait(10 * time.Millisecond); err != nil {
			return err
		}
		pids = procs()
	}
	return fmt.Errorf("processes of %s keep running: %v", what, pids)
}

// machinePID reads the pid file rel (a machine path) under root and reports whether that
// process runs and is the machine's (its command line names a file under root), so a stale pid
// file never gets another process killed.
func machinePID(root, rel string) (int, bool) {
	b, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return 0, false
	}
	if !running(pid) {
		return pid, false
	}
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || !bytes.Contains(cmdline, []byte(root+"/")) {
		return pid, false
	}
	return pid, true
}

// running reports whether pid exists and is not a zombie.
func running(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// pid (comm) S ...: the state follows the last ')'.
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] != 'Z' && b[i+2] != 'X'
}

// stopGroups stops the process groups whose leaders' pids are in the machine's pid files (each
// a setsid leader: provisioning, klient's supervisor): SIGTERM, up to 5 s, then SIGKILL.
func stopGroups(ctx context.Context, root string, pidFiles ...string) error {
	var pids []int
	for _, f := range pidFiles {
		if pid, ok := machinePID(root, f); ok {
			pids = append(pids, pid)
			syscall.Kill(-pid, syscall.SIGTERM)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for _, pid := range pids {
		for running(pid) && time.Now().Before(deadline) {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
		}
		syscall.Kill(-pid, syscall.SIGKILL) // the group's other members, or the leader itself
	}
	return nil
}

func tail(s string, n int) string {
	if len(s) > n {
		s = s[len(s)-n:]
	}
	return strings.TrimSpace(s)
}

func httpError(w http.ResponseWriter, code int, err error) {
	writeJSON(w, code, map[string]string{"error": err.Error()})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}
