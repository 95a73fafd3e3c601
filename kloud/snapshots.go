package kloud

import (
	"context"
	"errors"
	"fmt"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/snapshots"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/provider"
)

// Snapshots: machine.snapshot and machine.restore (durable jobs on the machine's lease),
// machine.snapshots and snapshot.delete. The engine (take, restore, delete, the quota, the jobs)
// is package kloud/snapshot; kloud builds it here (snapshotDeps: kloud's machines, leases and
// jobs as its small interfaces), checks who calls and what they may do in the RPC handlers, and
// runs its job kinds.

// Job kinds.
const (
	jobMachineSnapshot = snapshots.JobSnapshot
	jobMachineRestore  = snapshots.JobRestore
)

// Defaults of Options.SnapshotQuota.
const (
	DefaultSnapshotCount = snapshots.DefaultCount
	DefaultSnapshotBytes = snapshots.DefaultBytes
)

// SnapshotQuota limits each user's snapshots: how many and how many bytes (snapshots.Quota).
type SnapshotQuota = snapshots.Quota

// ParseSnapshotQuota parses "COUNT,SIZE" (kloud serve --snapshot-quota; snapshots.ParseQuota).
func ParseSnapshotQuota(s string) (SnapshotQuota, error) { return snapshots.ParseQuota(s) }

// snapshotAPI serves machine.snapshot, machine.snapshots, machine.restore and snapshot.delete,
// and runs the machine.snapshot and machine.restore jobs (routes.go's job kinds) on its engine.
// New builds it once (Server.snapshots).
type snapshotAPI struct {
	engine      *snapshots.Engine
	snaps       *store.Snapshots
	loadMachine func(ctx context.Context, c *Caller, id string) (*model.Machine, error) // Server.loadMachine
}

// newSnapshotEngine is the snapshot engine over s's store, providers, machines, leases and jobs.
func newSnapshotEngine(s *Server) *snapshots.Engine {
	d := snapshotDeps{s}
	return snapshots.New(snapshots.Options{Store: s.store, Providers: s.providers,
		Machines: d, Leases: d, Jobs: d, Planner: s.planner,
		Quota: s.opts.SnapshotQuota, AgentTimeout: s.opts.AgentTimeout, Logger: s.log})
}

// snapshotDeps is kloud as the snapshot engine's Machines, Leases and Jobs.
type snapshotDeps struct{ s *Server }

func (d snapshotDeps) Load(ctx context.Context, id string) (*model.Machine, error) {
	return d.s.loadMachine(ctx, nil, id)
}

func (d snapshotDeps) ProviderMachine(ctx context.Context, m *model.Machine) (provider.Machine, error) {
	return d.s.providerMachine(ctx, nil, m)
}

func (d snapshotDeps) Capable(name, method string, cap provider.Capability) error {
	return d.s.capable(name, method, cap)
}

func (d snapshotDeps) Set(ctx context.Context, id string, from []provider.State, set store.MachineSet) bool {
	return d.s.flow().SetMachine(ctx, id, from, set)
}

func (d snapshotDeps) SetAgent(ctx context.Context, kiteID, status, version string) {
	d.s.setAgent(ctx, kiteID, status, version)
}

// Started restarts the machine's idle countdown (idle.go).
func (d snapshotDeps) Started(ctx context.Context, id string) { d.s.idle.RestartCountdown(ctx, id) }

func (d snapshotDeps) Take(ctx context.Context, name, kind, busy string) (string, func(), error) {
	return d.s.flow().TakeLease(ctx, name, kind, busy)
}

func (d snapshotDeps) Retake(ctx context.Context, name, owner string) error {
	return d.s.flow().RetakeLease(ctx, name, owner)
}

func (d snapshotDeps) Keep(ctx context.Context, name, owner string) (stop func()) {
	return d.s.flow().KeepLease(ctx, name, owner)
}

func (d snapshotDeps) Start(ctx context.Context, id, kind, target, owner string, p snapshots.Params) (string, error) {
	switch kind {
	case jobMachineSnapshot:
		return snapshotJob.StartID(ctx, d.s, id, target, owner, p)
	case jobMachineRestore:
		return restoreJob.StartID(ctx, d.s, id, target, owner, p)
	}
	return "", fmt.Errorf("snapshot engine: unknown job kind %q", kind)
}

// mayManage reports whether c may snapshot or restore machine m: its owner, a team admin, or a
// user it is shared with "full" (who may do anything the owner can).
func (c *Caller) mayManage(m *model.Machine) bool {
	return m.Owner == c.Username || c.TeamAdmin(m.Team) || hasGrant(m, c.Username, model.GrantFull)
}

// take serves machine.snapshot.
func (a *snapshotAPI) take(ctx context.Context, c *Caller, _ *kite.Request, p *api.SnapshotParams) (api.SnapshotStarted, error) {
	m, err := a.loadMachine(ctx, c, p.MachineID)
	if err != nil {
		return api.SnapshotStarted{}, err
	}
	if !c.mayManage(m) {
		return api.SnapshotStarted{}, fmt.Errorf("only the owner may snapshot machine %s: %w", m.Label, kite.ErrPermission)
	}
	return a.engine.Take(ctx, m, c.Username, p.Name)
}

// load returns snapshot id if c may use it (its owner, kloud admins), else not found.
func (a *snapshotAPI) load(ctx context.Context, c *Caller, id string) (*model.Snapshot, error) {
	sn, err := a.snaps.Get(ctx, id)
	if errors.Is(err, store.ErrNotFound) || err == nil && sn.Owner != c.Username && !c.Admin {
		return nil, notFound("snapshot", id)
	}
	if err != nil {
		return nil, err
	}
	return &sn, nil
}

// list serves machine.snapshots.
func (a *snapshotAPI) list(ctx context.Context, c *Caller, _ *kite.Request, p *api.SnapshotsParams) (api.SnapshotsResult, error) {
	return a.engine.List(ctx, c.Username, p.MachineID)
}

// restore serves machine.restore.
func (a *snapshotAPI) restore(ctx context.Context, c *Caller, _ *kite.Request, p *api.RestoreParams) (api.JobRef, error) {
	sn, err := a.load(ctx, c, p.SnapshotID)
	if err != nil {
		return api.JobRef{}, err
	}
	if sn.Status != model.SnapshotReady {
		return api.JobRef{}, fmt.Errorf("snapshot %s is %s, only a ready snapshot can be restored: %w", sn.ID, sn.Status, kite.ErrState)
	}
	target := p.MachineID
	if target == "" {
		target = sn.MachineID
	}
	m, err := a.loadMachine(ctx, c, target)
	if err != nil {
		if p.MachineID == "" && errors.Is(err, kite.ErrNotFound) {
			return api.JobRef{}, fmt.Errorf("machine %s of snapshot %s no longer exists: restore it into another %s machine (machineId): %w",
				sn.MachineLabel, sn.ID, sn.Provider, kite.ErrNotFound)
		}
		return api.JobRef{}, err
	}
	if !c.mayManage(m) {
		return api.JobRef{}, fmt.Errorf("only the owner may restore into machine %s: %w", m.Label, kite.ErrPermission)
	}
	return a.engine.Restore(ctx, sn, m, c.Username)
}

// delete serves snapshot.delete.
func (a *snapshotAPI) delete(ctx context.Context, c *Caller, _ *kite.Request, p *api.SnapshotRef) (model.Snapshot, error) {
	sn, err := a.load(ctx, c, p.SnapshotID)
	if err != nil {
		return model.Snapshot{}, err
	}
	if err := a.engine.Delete(ctx, sn, c.Username); err != nil {
		return model.Snapshot{}, err
	}
	return *sn, nil
}

// runSnapshot is the machine.snapshot job (snapshots.Engine.RunSnapshot).
func (a *snapshotAPI) runSnapshot(ctx context.Context, j *jobCtx, p snapshots.Params, recovering bool) (snapshots.SnapshotResult, error) {
	return a.engine.RunSnapshot(ctx, j, p, recovering)
}

// runRestore is the machine.restore job (snapshots.Engine.RunRestore).
func (a *snapshotAPI) runRestore(ctx context.Context, j *jobCtx, p snapshots.Params, recovering bool) (snapshots.RestoreResult, error) {
	return a.engine.RunRestore(ctx, j, p, recovering)
}
