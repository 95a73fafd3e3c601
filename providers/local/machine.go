package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/local/sandbox"
)

// machine is one local machine as kloud controls it, outside Terraform.
type machine struct {
	l  *Local
	m  *sandbox.Manager
	id string // the sandbox id: the kloudlocal_machine's "id" attribute
	b  *provider.BaseMachine
}

func (l *Local) machine(b *provider.BaseMachine) (provider.Machine, error) {
	m, err := l.manager()
	if err != nil {
		return nil, err
	}
	id, _ := b.Attributes["id"].(string)
	if id == "" {
		return nil, fmt.Errorf("local machine %s: no id in its Terraform state (attributes %v): %w", b.Label, keys(b.Attributes), kite.ErrState)
	}
	return &machine{l: l, m: m, id: id, b: b}, nil
}

func keys(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// wrap names the operation and adds kite.ErrNotFound to sandbox.ErrNotFound, for kloud's error codes.
func (m *machine) wrap(op string, err error) error {
	if errors.Is(err, sandbox.ErrNotFound) {
		return fmt.Errorf("%s local machine %s (%s): %w: %w", op, m.b.Label, m.id, err, kite.ErrNotFound)
	}
	return fmt.Errorf("%s local machine %s (%s): %w", op, m.b.Label, m.id, err)
}

// meta is what kloud stores as the machine's metadata: the sandbox id and the address.
func meta(in sandbox.Info) map[string]any {
	out := map[string]any{"machine_id": in.ID}
	if in.IP.IsValid() {
		out["ip_address"] = in.IP.String()
	}
	return out
}

// Start boots the machine again on its disk (cloud-init's per-boot modules run again, which
// restarts the agent).
func (m *machine) Start(ctx context.Context) (any, error) {
	in, err := m.m.Start(ctx, m.id)
	if err != nil {
		return nil, m.wrap("start", err)
	}
	return meta(in), nil
}

// Stop ends every process of the machine and keeps its disk.
func (m *machine) Stop(ctx context.Context) (any, error) {
	in, err := m.m.Stop(ctx, m.id)
	if err != nil {
		return nil, m.wrap("stop", err)
	}
	return meta(in), nil
}

// Info reports running → Running, stopped → Stopped, absent → Terminated.
func (m *machine) Info(ctx context.Context) (provider.State, any, error) {
	in, err := m.m.Info(ctx, m.id)
	if err != nil {
		return provider.Unknown, nil, m.wrap("inspect", err)
	}
	switch in.State {
	case sandbox.StateRunning:
		return provider.Running, meta(in), nil
	case sandbox.StateStopped:
		return provider.Stopped, meta(in), nil
	case sandbox.StateAbsent:
		return provider.Terminated, nil, nil
	}
	return provider.Unknown, nil, fmt.Errorf("local machine %s (%s): unknown sandbox state %q", m.b.Label, m.id, in.State)
}

// ConsoleLog implements provider.ConsoleLogger: the end (at most ConsoleMax bytes) of the
// machine's console, StateDir/<id>/console.log on the host: init's own lines and everything the
// cloud-init stages print (the user data's scripts included, with provision.sh's markers). It is
// read on the host, so it works while the machine is stopped or its agent never came up, and the
// machine cannot change where it is read from (the file is outside its disk).
func (m *machine) ConsoleLog(ctx context.Context) (string, error) {
	in, err := m.m.Info(ctx, m.id)
	if err != nil {
		return "", m.wrap("read console of", err)
	}
	if in.State == sandbox.StateAbsent || in.Dir == "" {
		return "", m.wrap("read console of", sandbox.ErrNotFound)
	}
	out, err := readTail(in.Dir, "console.log", ConsoleMax)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil // not booted yet
	}
	if err != nil {
		return "", m.wrap("read console of", err)
	}
	return out, nil
}

// ConsoleMax bounds what ConsoleLog returns (the end of the log).
const ConsoleMax = 64 << 10

// readTail returns the last limit bytes of the regular file rel under dir, resolved inside dir.
func readTail(dir, rel string, limit int64) (string, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return "", err
	}
	defer root.Close()
	f, err := root.Open(rel)
	if err != nil {
		return "", err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", err
	}
	if !st.Mode().IsRegular() {
		return "", fmt.Errorf("%s: not a regular file: %w", rel, fs.ErrNotExist)
	}
	off := max(st.Size()-limit, 0)
	b, err := io.ReadAll(io.NewSectionReader(f, off, st.Size()-off))
	return string(b), err
}

var (
	_ provider.Machine       = (*machine)(nil)
	_ provider.ConsoleLogger = (*machine)(nil)
)
