package example

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/provider/plugin"
	"github.com/kloud-dev/kloud/userdata"
)

// Resume powers on again the machines that were on when the provider's previous process ended:
// what a hypervisor host does with its autostart VMs after a reboot. The plugin's main calls it
// before it serves kloud. A plugin's machines are processes in its sandbox, and kloud's launcher
// ends everything in that sandbox when the plugin exits (nothing of a plugin outlives it); so
// after a crash and restart every machine is off, though kloud believes it Running and the
// build that made it may be waiting for its agent. Resume starts, for every machine whose boot
// finished and that was not stopped (record Off), its agent again from its disk; a machine whose
// provisioning was cut before it installed the agent has its provisioning script run again from
// the start (as a VM whose first boot died), as has one whose provisioning (which runs on in the
// background after the boot) had not finished. It returns how many machines it powered on; a
// machine it could not start is logged and counted in the error, the others still start.
func Resume(ctx context.Context, o Options) (int, error) {
	e := newExample(o)
	if err := e.available(); err != nil {
		return 0, err
	}
	recs, err := e.records("")
	if err != nil {
		return 0, fmt.Errorf("resume: %w", err)
	}
	n := 0
	var errs []error
	for _, p := range recs {
		if !p.rec.Complete || p.rec.Off {
			continue // a boot that did not finish (its build failed: kloud removes it), or stopped
		}
		started, err := e.resume(ctx, p.stack, p.label)
		failed := filepath.Join(e.dir(p.stack, p.label), resumeFailedPath)
		if err != nil {
			if os.MkdirAll(filepath.Dir(failed), 0o755) == nil {
				os.WriteFile(failed, []byte(err.Error()+"\n"), 0o600) // ConsoleLog says why
			}
			e.o.Logger.Warn("resume: the machine stays off", "stack", p.stack, "machine", p.label, "err", err)
			errs = append(errs, err)
			continue
		}
		os.Remove(failed)
		if started {
			e.o.Logger.Info("resume: powered on again", "stack", p.stack, "machine", p.label)
			n++
		}
	}
	if err := errors.Join(errs...); err != nil {
		return n, fmt.Errorf("resume: %w", err)
	}
	return n, nil
}

// resume powers on machine label of stack if its agent's supervisor is not running.
func (e *example) resume(ctx context.Context, stackID, label string) (bool, error) {
	dir := e.dir(stackID, label)
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return false, nil // its disk is gone: destroyed; kloud's gc judges the record
	}
	if supervisor(dir) > 0 {
		return false, nil
	}
	if provisioned(dir) {
		m := &machine{e: e, b: &provider.BaseMachine{StackID: stackID, Label: label}}
		_, err := m.Start(ctx)
		return err == nil, err
	}
	// Provisioning did not finish (it runs in the background after the boot, and died with the
	// plugin): provision from the start. Starting only the agent would leave it reporting a
	// step that never ends, and the build waiting for it until the planner's timeout (the
	// chaos suite's plugin-apply, killed 0.7 s after terraform's apply ended).
	defer e.lock(dir)()
	if err := stopMachine(ctx, dir); err != nil {
		return false, fmt.Errorf("%s: %w", label, err)
	}
	// The script writes the kite key again, and the one it wrote is read-only.
	if err := os.Remove(filepath.Join(dir, userdata.KiteKeyPath)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("%s: %w", label, err)
	}
	cmd := exec.CommandContext(ctx, "/bin/bash", filepath.Join(dir, "var/lib/cloud/user-data.txt"))
	cmd.Dir, cmd.Env = dir, machineEnv(dir, home(dir))
	if out, err := cmd.CombinedOutput(); err != nil {
		return false, fmt.Errorf("%s: provision again: %w: %s", label, err, strings.TrimSpace(string(out)))
	}
	return true, nil
}

// provisioned reports whether provisioning of the machine at dir ran to its end (provision.sh's
// status says step done, ok or failed): then its agent only needs starting again.
func provisioned(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, userdata.ProvisionStatusPath))
	if err != nil {
		return false
	}
	var st userdata.ProvisionStatus
	return json.Unmarshal(b, &st) == nil && st.Step == userdata.StepDone
}

// resumeFailedPath, in a machine's disk, holds why Resume could not power it on again (removed
// when it or Start does).
const resumeFailedPath = "var/lib/kloud-example/resume-failed"

// consoleMax is how much of a machine's boot output ConsoleLog returns (its end).
const consoleMax = 64 << 10

// ConsoleLog returns the end of the machine's boot output (what its provisioning printed, as
// cloud-init's output log of a VM): kloud names a failed provisioning step from it. If the
// plugin restarted and could not power the machine on again, it ends with provisioning's
// failure marker saying so, so that a build waiting for the agent fails at once with that
// reason instead of at its timeout.
func (m *machine) ConsoleLog(ctx context.Context) (string, error) {
	if !plugin.ValidName(m.b.StackID) || !plugin.ValidName(m.b.Label) {
		return "", fmt.Errorf("example: machine %q of stack %q: not a machine of this provider", m.b.Label, m.b.StackID)
	}
	b, err := readTail(filepath.Join(m.dir(), userdata.CloudInitOutputPath), consoleMax)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("example: console of %s: %w", m.b.Label, err)
	}
	out := string(b)
	if why, err := readTail(filepath.Join(m.dir(), resumeFailedPath), 4<<10); err == nil {
		if out != "" && !strings.HasSuffix(out, "\n") {
			out += "\n"
		}
		detail, _ := json.Marshal("the provider plugin restarted and the machine's agent did not come back: " + strings.TrimSpace(string(why)))
		out += userdata.MarkerPrefix + "step=" + userdata.StepStartKlient + " status=" + userdata.StatusFailed + " detail=" + string(detail) + "\n"
	}
	return out, nil
}

// readTail reads at most the last max bytes of the regular file at path (a link is refused).
func readTail(path string, max int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file", path)
	}
	if st.Size() > max {
		if _, err := f.Seek(st.Size()-max, io.SeekStart); err != nil {
			return nil, err
		}
	}
	return io.ReadAll(io.LimitReader(f, max))
}

var _ provider.ConsoleLogger = (*machine)(nil)
