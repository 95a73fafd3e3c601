package p2

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// proc is a child process the benchmark started: its stdout is scanned line by line (and copied
// to a log file with its stderr), and stop ends it by its pid.
type proc struct {
	name  string
	cmd   *exec.Cmd
	lines chan string   // stdout lines, until it closes
	done  chan struct{} // closed once the process has been waited for
	err   error         // from Wait, once done is closed
	log   *os.File
}

// startProc starts path with args; stdout and stderr go to logPath as well.
func startProc(name, path string, args []string, logPath string) (*proc, error) {
	lf, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	cmd := exec.Command(path, args...)
	cmd.Stderr = lf
	// The child dies with us even if we are killed before stop runs.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		lf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, lines: make(chan string, 64), done: make(chan struct{}), log: lf}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			fmt.Fprintln(lf, sc.Text())
			select {
			case p.lines <- sc.Text():
			default: // nobody is waiting for lines any more
			}
		}
		close(p.lines)
		p.err = cmd.Wait()
		lf.Close()
		close(p.done)
	}()
	return p, nil
}

// Pid is the child's process id.
func (p *proc) Pid() int { return p.cmd.Process.Pid }

// waitLine waits for a stdout line starting with prefix and returns it.
func (p *proc) waitLine(ctx context.Context, prefix string, timeout time.Duration) (string, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				<-p.done
				return "", fmt.Errorf("%s exited before printing %q: %w (log: %s)", p.name, prefix, p.exitErr(), p.log.Name())
			}
			if strings.HasPrefix(l, prefix) {
				return l, nil
			}
		case <-t.C:
			return "", fmt.Errorf("%s printed no %q within %s (log: %s)", p.name, prefix, timeout, p.log.Name())
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
}

func (p *proc) exitErr() error {
	if p.err == nil {
		return errors.New("exit status 0")
	}
	return p.err
}

// running reports whether the process has not exited.
func (p *proc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// stop sends SIGTERM to the process (by pid), and SIGKILL if it has not exited after grace.
func (p *proc) stop(grace time.Duration) {
	if !p.running() {
		return
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return
	case <-time.After(grace):
	}
	p.cmd.Process.Kill()
	<-p.done
}

// readLog returns the tail of the process's log, for error messages.
func readLogTail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return ""
	}
	off := max(0, st.Size()-int64(n))
	b := make([]byte, st.Size()-off)
	if _, err := f.ReadAt(b, off); err != nil && !errors.Is(err, io.EOF) {
		return ""
	}
	return string(b)
}
