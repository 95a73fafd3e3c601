package plugin

import (
	"context"
	"errors"
	"fmt"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/provider"
)

// Snapshots over the plugin wire (capability "snapshot", provider.Snapshotter): kloud calls
// machine.snapshot, machine.restore and machine.deleteSnapshot on the plugin with the machine and
// the snapshot's id; the plugin's machine does the work. A plugin that finds the machine running
// answers with provider.ErrRunning, which crosses the wire as -32005 of type "running".

// Snapshot methods kloud calls on a plugin.
const (
	MethodMachineSnapshot       = "machine.snapshot"
	MethodMachineRestore        = "machine.restore"
	MethodMachineDeleteSnapshot = "machine.deleteSnapshot"
)

type snapshotParams struct {
	Machine    wireMachine `json:"machine"`
	SnapshotID string      `json:"snapshotId"`
}

func (p *snapshotParams) Validate() error {
	if p.Machine.ID == "" {
		return errors.New("machine.id is required")
	}
	return provider.SnapshotIDOK(p.SnapshotID)
}

const typeRunning = "running"

// errRunning carries provider.ErrRunning over the wire.
var errRunning = &kite.Error{Code: kite.CodeState, Message: provider.ErrRunning.Error(), Data: &kite.ErrorData{Type: typeRunning}}

// snapshotWireErr keeps provider.ErrUnsupported and provider.ErrRunning recognizable.
func snapshotWireErr(err error) error {
	if err != nil && errors.Is(err, provider.ErrRunning) {
		return fmt.Errorf("%w: %s", errRunning, err.Error())
	}
	return wireErr(err)
}

// fromWireRunning turns a plugin's "running" error back into provider.ErrRunning.
func fromWireRunning(err error) error {
	var ke *kite.Error
	if errors.As(err, &ke) && ke.Data != nil && ke.Data.Type == typeRunning {
		return fmt.Errorf("%s: %w", ke.Message, provider.ErrRunning)
	}
	return err
}

// ---- kloud's side: the proxy machine

func (m *proxyMachine) snapshotCall(ctx context.Context, method, what, snapID string, res any) error {
	if !m.can(provider.CapSnapshot) {
		return fmt.Errorf("provider %s: %s: %w", m.name, what, provider.ErrUnsupported)
	}
	w, err := toWireMachine(m.b)
	if err != nil {
		return err
	}
	return fromWireRunning(m.h.call(ctx, m.name, method, &snapshotParams{Machine: w, SnapshotID: snapID}, res))
}

// Snapshot implements provider.Snapshotter.
func (m *proxyMachine) Snapshot(ctx context.Context, snapID string) (provider.SnapshotInfo, error) {
	var res provider.SnapshotInfo
	err := m.snapshotCall(ctx, MethodMachineSnapshot, "snapshot", snapID, &res)
	return res, err
}

// Restore implements provider.Snapshotter.
func (m *proxyMachine) Restore(ctx context.Context, snapID string) error {
	return m.snapshotCall(ctx, MethodMachineRestore, "restore", snapID, nil)
}

// DeleteSnapshot implements provider.Snapshotter.
func (m *proxyMachine) DeleteSnapshot(ctx context.Context, snapID string) error {
	return m.snapshotCall(ctx, MethodMachineDeleteSnapshot, "delete snapshot", snapID, nil)
}

var _ provider.Snapshotter = (*proxyMachine)(nil)

// ---- the plugin's side

func (s *server) handleSnapshots(k *kite.Kite) {
	k.Handle(MethodMachineSnapshot, kite.Typed(s.machineSnapshot))
	k.Handle(MethodMachineRestore, kite.Typed(s.machineRestore))
	k.Handle(MethodMachineDeleteSnapshot, kite.Typed(s.machineDeleteSnapshot))
}

func (s *server) snapshotter(w *wireMachine) (provider.Snapshotter, error) {
	m, err := s.machine(w)
	if err != nil {
		return nil, err
	}
	sp, ok := m.(provider.Snapshotter)
	if !ok {
		return nil, wireErr(fmt.Errorf("snapshots: %w", provider.ErrUnsupported))
	}
	return sp, nil
}

func (s *server) machineSnapshot(ctx context.Context, _ *kite.Request, p *snapshotParams) (any, error) {
	sp, err := s.snapshotter(&p.Machine)
	if err != nil {
		return nil, err
	}
	info, err := sp.Snapshot(ctx, p.SnapshotID)
	if err != nil {
		return nil, snapshotWireErr(err)
	}
	return info, nil
}

func (s *server) machineRestore(ctx context.Context, _ *kite.Request, p *snapshotParams) (any, error) {
	sp, err := s.snapshotter(&p.Machine)
	if err != nil {
		return nil, err
	}
	return struct{}{}, snapshotWireErr(sp.Restore(ctx, p.SnapshotID))
}

func (s *server) machineDeleteSnapshot(ctx context.Context, _ *kite.Request, p *snapshotParams) (any, error) {
	sp, err := s.snapshotter(&p.Machine)
	if err != nil {
		return nil, err
	}
	return struct{}{}, snapshotWireErr(sp.DeleteSnapshot(ctx, p.SnapshotID))
}
