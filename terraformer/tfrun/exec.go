package tfrun

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/terraform-exec/tfexec"

	"github.com/kloud-dev/kloud/terraformer/tfsandbox"
)

// terraform runs terraform commands through terraform-exec, with the sandbox launcher
// (terraformer/tfsandbox) as the executable. Like coder's executor it uses two contexts:
// cancelling ctx makes terraform-exec send SIGINT (the launcher passes it on to terraform, which
// stops its providers and writes the state) and SIGKILL CancelGrace later; cancelling kill sends
// SIGKILL at once. A SIGKILL of the launcher ends everything terraform started (its pid namespace).
type terraform struct {
	launcher string
	sandbox  tfsandbox.Config // without WorkDir
	env      map[string]string
	grace    time.Duration
	logger   *slog.Logger

	mu        sync.Mutex
	instances map[string]*tfexec.Terraform // by directory: terraform-exec caches the version per instance
}

// passEnv are the variables of terraformer's environment that terraform gets; everything else
// (kloud's settings, credentials, TF_* variables that would change what a run does) stays out.
func passEnv(name string) bool {
	switch name {
	case "PATH", "LANG", "LANGUAGE", "TZ", "SSL_CERT_FILE", "SSL_CERT_DIR",
		"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy":
		return true
	}
	return strings.HasPrefix(name, "LC_")
}

// terraformEnv is terraform's environment: passEnv's variables of this process plus the settings
// every run needs. (terraform-exec adds TF_IN_AUTOMATION and empties TF_LOG*; -input=false is on
// every command line.) The plugin cache is left out on purpose: it is unsafe for concurrent init.
func terraformEnv(cliConfig string, insecure bool) map[string]string {
	env := map[string]string{}
	for _, kv := range os.Environ() {
		name, val, _ := strings.Cut(kv, "=")
		if passEnv(name) || (insecure && name == "HOME") {
			env[name] = val
		}
	}
	env["TF_CLI_CONFIG_FILE"] = cliConfig
	env["CHECKPOINT_DISABLE"] = "1"
	return env
}

// command is one terraform command: where it runs and what it may see besides the work dir.
type command struct {
	dir      string   // terraform-exec's working directory
	work     bool     // dir is the run's work dir, bound read-write in the sandbox
	readOnly []string // extra read-only paths (the variables file)
	stdout   io.Writer
	stderr   io.Writer
}

// run runs fn (one terraform-exec call) for c. It returns when terraform has exited (and, after a
// cancel, everything it started is gone).
func (t *terraform) run(ctx, kill context.Context, c command, name string, fn func(context.Context, *tfexec.Terraform) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	token := randomHex(12)
	cfg := t.sandbox
	cfg.ReadOnly = append(append([]string(nil), cfg.ReadOnly...), c.readOnly...)
	if c.work {
		cfg.WorkDir = c.dir
	}
	senv, err := cfg.Env(token)
	if err != nil {
		return err
	}
	env := maps.Clone(t.env)
	maps.Copy(env, senv)
	tf, err := t.instance(c.dir)
	if err != nil {
		return err
	}
	if err := tf.SetEnv(env); err != nil {
		return fmt.Errorf("terraform environment: %w", err)
	}
	if err := tf.SetWaitDelay(t.grace); err != nil {
		return fmt.Errorf("terraform wait delay: %w", err)
	}
	// terraform-exec asks `terraform version` before an instance's first command, with the
	// instance's writers: ask it now, while they are unset, so that its output is not taken for
	// the command's. (It is cached from then on.)
	tf.SetStdout(nil)
	tf.SetStderr(nil)
	if _, _, err := tf.Version(ctx, false); err != nil {
		return fmt.Errorf("terraform version: %w", err)
	}
	tf.SetStdout(c.stdout)
	tf.SetStderr(c.stderr)
	defer func() {
		tf.SetStdout(nil)
		tf.SetStderr(nil)
	}()

	log := t.logger.With("cmd", name, "run", token)
	log.Debug("terraform starting", "dir", c.dir)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		select {
		case <-done:
		case <-kill.Done():
			log.Warn("terraform killed", "processes", tfsandbox.Kill(token))
		}
	})
	err = fn(ctx, tf)
	close(done)
	wg.Wait()
	if ctx.Err() != nil || kill.Err() != nil {
		// Without the sandbox (development), sweep what terraform left: its environment carries
		// the token. With it, the pid namespace is gone already and this finds nothing.
		if n := tfsandbox.Kill(token); n > 0 {
			log.Warn("killed what terraform left", "processes", n)
		}
	}
	if cerr := tfsandbox.RemoveCgroup(cfg, token); cerr != nil {
		log.Warn("terraform's cgroup", "err", cerr)
	}
	log.Debug("terraform exited", "err", err)
	if err != nil {
		return fmt.Errorf("terraform %s: %w", name, err)
	}
	return nil
}

// instance returns the terraform-exec instance for dir. Instances are kept because each one asks
// `terraform version` before its first command; the commands for one dir run one at a time (the
// content id's lease), so sharing one is safe.
func (t *terraform) instance(dir string) (*tfexec.Terraform, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if tf := t.instances[dir]; tf != nil {
		return tf, nil
	}
	tf, err := tfexec.NewTerraform(dir, t.launcher)
	if err != nil {
		return nil, fmt.Errorf("terraform-exec: %w", err)
	}
	if t.instances == nil {
		t.instances = map[string]*tfexec.Terraform{}
	}
	t.instances[dir] = tf
	return tf, nil
}

// chownTree gives the tree at root (not following symlinks) to uid:gid.
func chownTree(root string, uid, gid int) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if err := os.Lchown(p, uid, gid); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	})
}

// lineWriter splits what is written to it into lines and hands each (without the newline) to fn.
// Lines longer than maxLine are cut. Call flush after the writer is done.
type lineWriter struct {
	fn  func([]byte)
	buf []byte
}

const maxLine = 1 << 20

func (w *lineWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			w.buf = append(w.buf, p...)
			if len(w.buf) > maxLine {
				w.fn(w.buf)
				w.buf = w.buf[:0]
			}
			break
		}
		line := p[:i]
		if len(w.buf) > 0 {
			w.buf = append(w.buf, line...)
			line = w.buf
		}
		w.fn(bytes.TrimSuffix(line, []byte("\r")))
		w.buf = w.buf[:0]
		p = p[i+1:]
	}
	return n, nil
}

func (w *lineWriter) flush() {
	if len(w.buf) > 0 {
		w.fn(w.buf)
		w.buf = w.buf[:0]
	}
}

// touchWriter calls touch on every write, then passes the bytes on.
type touchWriter struct {
	w     io.Writer
	touch func()
}

func (w touchWriter) Write(p []byte) (int, error) {
	w.touch()
	return w.w.Write(p)
}
