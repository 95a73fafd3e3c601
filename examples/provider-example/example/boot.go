package example

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/provider/plugin"
)

// The provider's HTTP service: what the generated terraform_data resources call with curl
// (see stack.go). kloud serves it at /provider/<name>/ on its own HTTP server; for a plugin,
// kloud forwards the request over the plugin's connection. It authenticates every request
// itself, with the build's token.

// claims is what a build's token says: the stack and its team, what kloud rendered for each of
// its machines (by label), and until when it may boot them (unix seconds).
type claims struct {
	Stack    string              `json:"stack"`
	Team     string              `json:"team,omitempty"`
	Machines map[string]bootSpec `json:"machines"`
	Exp      int64               `json:"exp"`
}

// bootSpec is one machine of a token.
type bootSpec struct {
	Script   string `json:"script"` // sha256 of the provisioning script kloud rendered
	Owner    string `json:"owner"`
	Hostname string `json:"hostname"`
	Network  string `json:"network,omitempty"`
	Machine  string `json:"machine"` // kloud's machine id
}

const tokenPrefix = "ex1."

var errToken = plugin.ErrBootToken

// tokens returns the signer of the build tokens (plugin.BootTokens), its key in Dir (mode 0600)
// so tokens outlive a restart: a stack is destroyed long after it was built.
func (e *example) tokens() (*plugin.BootTokens, error) {
	if err := e.available(); err != nil {
		return nil, err
	}
	e.tokensOnce.Do(func() {
		e.bootTokens = &plugin.BootTokens{Prefix: tokenPrefix, KeyFile: filepath.Join(e.o.Dir, "token.key")}
	})
	return e.bootTokens, nil
}

// kept returns the content of file name in Dir, written with fresh (mode 0600) if there is none:
// written aside, then linked into place. A link fails if the file exists, so the first writer
// wins and everyone reads its content.
func (e *example) kept(name string, fresh []byte) ([]byte, error) {
	if err := e.available(); err != nil {
		return nil, err
	}
	path := filepath.Join(e.o.Dir, name)
	if b, err := os.ReadFile(path); err == nil || !errors.Is(err, fs.ErrNotExist) {
		return b, err
	}
	f, err := os.CreateTemp(e.o.Dir, name+".new*")
	if err != nil {
		return nil, err
	}
	defer os.Remove(f.Name())
	_, err = f.Write(fresh)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Link(f.Name(), path)
	}
	if err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, err
	}
	return os.ReadFile(path)
}

func (e *example) mint(c claims) (string, error) {
	t, err := e.tokens()
	if err != nil {
		return "", err
	}
	tok, err := t.Mint(c)
	if err != nil {
		return "", fmt.Errorf("example: %w", err)
	}
	return tok, nil
}

// verify checks a token's signature and, for a boot, that it has not expired (a destroy
// accepts an expired token of its stack).
func (e *example) verify(token string, checkExp bool) (*claims, error) {
	t, err := e.tokens()
	if err != nil {
		return nil, err
	}
	var c claims
	if err := t.Verify(token, &c); err != nil {
		if errors.Is(err, plugin.ErrBootToken) {
			return nil, errToken
		}
		return nil, fmt.Errorf("example: %w", err)
	}
	if !plugin.ValidName(c.Stack) {
		return nil, errToken
	}
	if checkExp && time.Now().Unix() >= c.Exp {
		return nil, errors.New("token expired: build the stack again")
	}
	return &c, nil
}

func (e *example) handler() http.Handler {
	mux := http.NewServeMux()
	p := provider.HandlerPrefix(e.o.Name) + "v1/machines/{stack}/{machine}/"
	mux.HandleFunc("POST "+p+"boot", e.serveBoot)
	mux.HandleFunc("POST "+p+"destroy", e.serveDestroy)
	return mux
}

// authorize checks the request's token against the machine it names, or writes the refusal.
func (e *example) authorize(w http.ResponseWriter, r *http.Request, boot bool) (*claims, string, bool) {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		httpError(w, http.StatusUnauthorized, errors.New("no bearer token"))
		return nil, "", false
	}
	c, err := e.verify(strings.TrimSpace(tok), boot)
	if err != nil {
		httpError(w, http.StatusUnauthorized, err)
		return nil, "", false
	}
	label := r.PathValue("machine")
	if _, ok := c.Machines[label]; !ok || r.PathValue("stack") != c.Stack {
		httpError(w, http.StatusForbidden, fmt.Errorf("machine %s/%s is not one of this token's build", r.PathValue("stack"), label))
		return nil, "", false
	}
	return c, label, true
}

func (e *example) serveBoot(w http.ResponseWriter, r *http.Request) {
	c, label, ok := e.authorize(w, r, true)
	if !ok {
		return
	}
	script, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 4<<20))
	if err != nil {
		httpError(w, http.StatusBadRequest, fmt.Errorf("read script: %w", err))
		return
	}
	if plugin.ScriptSum(script) != c.Machines[label].Script {
		httpError(w, http.StatusForbidden, fmt.Errorf("machine %s: not the script kloud rendered for it", label))
		return
	}
	resource := r.URL.Query().Get("resource")
	if !resourceIDRe.MatchString(resource) {
		httpError(w, http.StatusBadRequest, fmt.Errorf("machine %s: resource %q: want the machine resource's id in Terraform's state (1-64 letters, digits and dashes); build the stack again", label, resource))
		return
	}
	// The boot outlives the request if curl gives up; it returns once provisioning runs.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 2*time.Minute)
	defer cancel()
	rec := record{ID: resource, Machine: c.Machines[label].Machine, Team: c.Team, Owner: c.Machines[label].Owner, Hostname: c.Machines[label].Hostname}
	if err := e.boot(ctx, c.Stack, label, c.Machines[label], rec, script); err != nil {
		e.o.Logger.Warn("boot", "stack", c.Stack, "machine", label, "err", err)
		httpError(w, http.StatusInternalServerError, err)
		return
	}
	e.o.Logger.Info("booted", "stack", c.Stack, "machine", label)
	writeJSON(w, http.StatusOK, map[string]any{"machine": label, "booted": true})
}

func (e *example) serveDestroy(w http.ResponseWriter, r *http.Request) {
	c, label, ok := e.authorize(w, r, false)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), time.Minute)
	defer cancel()
	if err := e.destroy(ctx, c.Stack, label, nil); err != nil {
		httpError(w, http.StatusInternalServerError, err)
		return
	}
	e.o.Logger.Info("destroyed", "stack", c.Stack, "machine", label)
	writeJSON(w, http.StatusOK, map[string]any{"machine": label, "destroyed": true})
}

// boot powers on a fresh machine: it lays down its "image" (an account for the owner, so the
// agent's terminal has a login shell, and the host name and network), then runs kloud's
// provisioning script with bash, which returns as soon as provisioning runs in the background.
// Its record (rec: tags and Terraform's id of it, resources.go) is written first and marked
// complete last. A machine booted again (Terraform replaced it) starts from scratch; a failed
// boot leaves nothing behind.
func (e *example) boot(ctx context.Context, stackID, label string, spec bootSpec, rec record, script []byte) (err error) {
	dir := e.dir(stackID, label)
	defer e.lock(dir)()
	if err := destroyDir(ctx, dir); err != nil {
		return err
	}
	if rec.Instance, err = e.instanceID(); err != nil {
		return err
	}
	rec.Created = time.Now().UTC()
	if err := e.writeRecord(stackID, label, rec); err != nil {
		return fmt.Errorf("boot %s: %w", label, err)
	}
	defer func() {
		if err != nil {
			destroyDir(context.WithoutCancel(ctx), dir)
			e.removeRecord(stackID, label)
		}
	}()
	home := filepath.Join(dir, "home", spec.Owner)
	// The owner's account has the provider's own uid: klient, which runs as that user, can
	// start the owner's shells without root.
	passwd := fmt.Sprintf("%s:x:%d:%d:%s:%s:/bin/bash\n", spec.Owner, os.Geteuid(), os.Getegid(), spec.Owner, home)
	files := map[string]string{
		"etc/passwd":                  passwd,
		"etc/group":                   fmt.Sprintf("%s:x:%d:\n", spec.Owner, os.Getegid()),
		"etc/hostname":                spec.Hostname + "\n",
		"etc/kloud-example/network":   spec.Network + "\n",
		"var/lib/cloud/user-data.txt": string(script), // what ran, as cloud-init keeps it
	}
	for name, content := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			return fmt.Errorf("boot %s: %w", label, err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			return fmt.Errorf("boot %s: %w", label, err)
		}
	}
	if err := os.MkdirAll(home, 0o755); err != nil {
		return fmt.Errorf("boot %s: %w", label, err)
	}
	cmd := exec.CommandContext(ctx, "/bin/bash", filepath.Join(dir, "var/lib/cloud/user-data.txt"))
	cmd.Dir, cmd.Env = dir, machineEnv(dir, home)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("boot %s: %w: %s", label, err, strings.TrimSpace(out.String()))
	}
	rec.Complete = true
	if err := e.writeRecord(stackID, label, rec); err != nil {
		return fmt.Errorf("boot %s: %w", label, err)
	}
	return nil
}

// destroy kills the machine's processes and removes its disk, then its record (and its stack's
// directory once empty). Destroying a machine that is not there succeeds. If check is set, it
// first gets the machine's record (nil: none) and the machine is destroyed only if it returns
// nil: the garbage collector's check that the machine is still the one it listed.
func (e *example) destroy(ctx context.Context, stackID, label string, check func(*record) error) error {
	dir := e.dir(stackID, label)
	defer e.lock(dir)()
	if check != nil {
		rec, err := e.readRecord(stackID, label)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("destroy %s: %w", label, err)
		}
		if err := check(rec); err != nil {
			return err
		}
	}
	if err := destroyDir(ctx, dir); err != nil {
		return fmt.Errorf("destroy %s: %w", label, err)
	}
	if err := e.removeRecord(stackID, label); err != nil {
		return fmt.Errorf("destroy %s: %w", label, err)
	}
	os.Remove(filepath.Dir(dir)) // fails while the stack has other machines
	return nil
}

func destroyDir(ctx context.Context, dir string) error {
	if err := stopMachine(ctx, dir); err != nil {
		return err
	}
	return os.RemoveAll(dir)
}

func httpError(w http.ResponseWriter, code int, err error) {
	writeJSON(w, code, map[string]string{"error": err.Error()})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}
