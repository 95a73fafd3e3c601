package tfrun

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// terraform runs the terraform binary. Like coder's executor it uses two contexts: cancelling ctx
// sends SIGINT to terraform, so it can stop its providers and write the state; the whole process
// group gets SIGKILL when terraform is still there CancelGrace later, or at once when kill is done.
type terraform struct {
	path   string
	env    []string
	grace  time.Duration
	logger *slog.Logger
}

// terraformEnv is the process environment minus every TF_* variable (TF_LOG, TF_VAR_*, TF_CLI_ARGS,
// TF_DATA_DIR, TF_WORKSPACE, TF_PLUGIN_CACHE_DIR, ... would each change what a run does, and the
// plugin cache is unsafe for concurrent init) plus the settings every run needs.
func terraformEnv(cliConfig string) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "TF_") || name == "CHECKPOINT_DISABLE" {
			continue
		}
		env = append(env, kv)
	}
	return append(env,
		"TF_CLI_CONFIG_FILE="+cliConfig,
		"TF_IN_AUTOMATION=1",
		"TF_INPUT=0",
		"CHECKPOINT_DISABLE=1",
	)
}

// run runs terraform with args in dir, copying its stdout and stderr to the writers. It returns
// when terraform has exited (and, after a cancel, its process group is gone).
func (t *terraform) run(ctx, kill context.Context, dir string, stdout, stderr io.Writer, args ...string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	cmd := exec.Command(t.path, args...)
	cmd.Dir = dir
	cmd.Env = t.env
	cmd.Stdout = stdout
	cmd.Stderr = stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setpgid: true, // our own process group, so SIGKILL reaches providers and provisioners too
		// If this process dies, so does terraform. Its children then are orphans; the next run's
		// lease and the state's own lock keep them from doing harm.
		Pdeathsig: syscall.SIGKILL,
	}
	// Plugins or provisioner commands that outlive terraform may hold its stdout open; do not
	// wait for them forever.
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start terraform: %w", err)
	}
	pid := cmd.Process.Pid
	log := t.logger.With("pid", pid, "cmd", args[0])
	log.Debug("terraform started", "args", args, "dir", dir)

	exited := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		select {
		case <-exited:
			return
		case <-ctx.Done():
			err := cmd.Process.Signal(os.Interrupt)
			log.Info("terraform interrupted", "err", err)
		case <-kill.Done():
		}
		if kill.Err() == nil {
			timer := time.NewTimer(t.grace)
			defer timer.Stop()
			select {
			case <-exited:
				return
			case <-timer.C:
			case <-kill.Done():
			}
		}
		err := syscall.Kill(-pid, syscall.SIGKILL)
		log.Warn("terraform killed", "err", err)
	})
	err := cmd.Wait()
	close(exited)
	wg.Wait()
	if ctx.Err() != nil || kill.Err() != nil {
		// Terraform is gone; sweep what it left in its process group (a provisioner's command, a
		// provider). ESRCH means nothing was left.
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
	log.Debug("terraform exited", "err", err)
	if err != nil {
		return fmt.Errorf("terraform %s: %w", args[0], err)
	}
	return nil
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
