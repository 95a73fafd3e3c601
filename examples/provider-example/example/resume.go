package example

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/kloud-dev/kloud/provider"
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
// the start (as a VM whose first boot died). It returns how many machines it powered on; a
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
		if err != nil {
			e.o.Logger.Warn("resume: the machine stays off", "stack", p.stack, "machine", p.label, "err", err)
			errs = append(errs, err)
			continue
		}
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
	if _, err := os.Stat(filepath.Join(dir, userdata.StartKlientPath)); err == nil {
		m := &machine{e: e, b: &provider.BaseMachine{StackID: stackID, Label: label}}
		_, err := m.Start(ctx)
		return err == nil, err
	}
	// Provisioning never got as far as the agent's starter: provision from the start.
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
