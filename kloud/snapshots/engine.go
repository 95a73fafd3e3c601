package snapshots

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/stackbuild"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/provider"
)

// startFrom are the states a snapshot or restore may start from.
var startFrom = []provider.State{provider.Running, provider.Stopped}

// Take starts a snapshot of machine m for user (kloud checked that user may manage m), named
// name ("": the machine's label and the time), after checking the owner's quota. The record is
// made before the job starts, with the job's id.
func (e *Engine) Take(ctx context.Context, m *model.Machine, user, name string) (api.SnapshotStarted, error) {
	if err := e.o.Machines.Capable(m.Provider, api.MethodMachineSnapshot, provider.CapSnapshot); err != nil {
		return api.SnapshotStarted{}, err
	}
	name = strings.TrimSpace(name)
	if name == "" {
		name = m.Label + " " + e.o.Store.Now().Format("2006-01-02 15:04:05")
	}
	q := e.Quota()
	if err := e.checkQuota(ctx, m.Owner, q, 0); err != nil {
		return api.SnapshotStarted{}, err
	}
	m, owner, release, err := e.leaseSettled(ctx, m, "snapshot", "taken of")
	if err != nil {
		return api.SnapshotStarted{}, err
	}
	// The job's id is recorded with the snapshot, so snapshot.delete always sees that it runs.
	jobID := store.NewID()
	sn := model.Snapshot{
		ID: store.NewID(), Name: name, Owner: m.Owner, Team: m.Team, MachineID: m.ID, MachineLabel: m.Label,
		StackID: m.StackID, Provider: m.Provider, Status: model.SnapshotCreating, KiteID: m.KiteID, Attributes: m.Attributes,
		JobID: jobID,
	}
	if err := e.o.Store.Snapshots().Insert(ctx, sn); err != nil {
		release()
		return api.SnapshotStarted{}, err
	}
	// Two requests racing past the first check: the one over the count gives way.
	if err := e.checkQuota(ctx, m.Owner, q, 1); err != nil {
		e.o.Store.Snapshots().Delete(context.WithoutCancel(ctx), sn.ID)
		release()
		return api.SnapshotStarted{}, err
	}
	id, err := e.o.Jobs.Start(ctx, jobID, JobSnapshot, "machine/"+m.ID, user,
		Params{MachineID: m.ID, SnapshotID: sn.ID, Lease: owner, From: m.State})
	if err != nil {
		e.o.Store.Snapshots().Delete(context.WithoutCancel(ctx), sn.ID)
		release()
		return api.SnapshotStarted{}, err
	}
	return api.SnapshotStarted{JobID: id, SnapshotID: sn.ID}, nil
}

// leaseSettled takes machine m's lease for a snapshot or restore job of kind and reads the
// machine again under it (no job changes it now); it must be Running or Stopped (how names the
// operation for that message: "taken of", "restored into"). The caller starts the job with
// owner as its "lease" param, or calls release.
func (e *Engine) leaseSettled(ctx context.Context, m *model.Machine, kind, how string) (_ *model.Machine, owner string, release func(), err error) {
	owner, release, err = e.o.Leases.Take(ctx, "machine/"+m.ID, kind, "machine "+m.Label+" is busy")
	if err != nil {
		return nil, "", nil, err
	}
	if m, err = e.o.Machines.Load(ctx, m.ID); err != nil {
		release()
		return nil, "", nil, err
	}
	if !slices.Contains(startFrom, m.State) {
		release()
		return nil, "", nil, fmt.Errorf("machine %s is %s; a snapshot is %s a Running or Stopped machine: %w", m.Label, m.State, how, kite.ErrState)
	}
	return m, owner, release, nil
}

// List is owner's snapshots (of machine machineID only, when set), with the owner's use of the
// quota (all of them).
func (e *Engine) List(ctx context.Context, owner, machineID string) (api.SnapshotsResult, error) {
	all, err := e.o.Store.Snapshots().List(ctx, store.SnapshotFilter{Owner: owner})
	if err != nil {
		return api.SnapshotsResult{}, err
	}
	out := api.SnapshotsResult{Snapshots: []model.Snapshot{}, Quota: e.Quota()}
	for _, sn := range all {
		out.Used.Count++
		out.Used.Bytes += sn.Size
		if machineID == "" || sn.MachineID == machineID {
			out.Snapshots = append(out.Snapshots, sn)
		}
	}
	return out, nil
}

// Restore starts restoring ready snapshot sn into machine m for user (kloud checked that user
// may use sn and manage m): m must be of sn's provider.
func (e *Engine) Restore(ctx context.Context, sn *model.Snapshot, m *model.Machine, user string) (api.JobRef, error) {
	if m.Provider != sn.Provider {
		return api.JobRef{}, fmt.Errorf("snapshot %s is of a %s machine; machine %s is %s: restore it into a %s machine: %w",
			sn.ID, sn.Provider, m.Label, m.Provider, sn.Provider, kite.ErrInvalidParams)
	}
	if err := e.o.Machines.Capable(m.Provider, api.MethodMachineRestore, provider.CapSnapshot); err != nil {
		return api.JobRef{}, err
	}
	m, owner, release, err := e.leaseSettled(ctx, m, "restore", "restored into")
	if err != nil {
		return api.JobRef{}, err
	}
	id, err := e.o.Jobs.Start(ctx, "", JobRestore, "machine/"+m.ID, user,
		Params{MachineID: m.ID, SnapshotID: sn.ID, Lease: owner, From: m.State})
	if err != nil {
		release()
		return api.JobRef{}, err
	}
	return api.JobRef{JobID: id}, nil
}

// Delete deletes snapshot sn (kloud checked that by may): its data at the provider, then
// its record. A snapshot whose job still runs is kite.ErrConflict.
func (e *Engine) Delete(ctx context.Context, sn *model.Snapshot, by string) error {
	if sn.Status == model.SnapshotCreating && sn.JobID != "" {
		if j, err := e.o.Store.Jobs().Get(ctx, sn.JobID); err == nil && !j.Status.Done() {
			return fmt.Errorf("snapshot %s is being made (job %s): wait for it or cancel the job first: %w", sn.ID, sn.JobID, kite.ErrConflict)
		}
	}
	pm, err := e.machineOf(ctx, sn)
	if err != nil {
		return fmt.Errorf("delete snapshot %s: %w", sn.ID, err)
	}
	if err := pm.DeleteSnapshot(ctx, sn.ID); err != nil {
		return fmt.Errorf("delete snapshot %s: %w", sn.ID, err)
	}
	if err := e.o.Store.Snapshots().Delete(ctx, sn.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
		return err
	}
	e.log.InfoContext(ctx, "snapshot deleted", "snapshot", sn.ID, "owner", sn.Owner, "by", by)
	return nil
}

// snapshotterOf returns provider machine pm as a Snapshotter (the provider advertises snapshots).
func snapshotterOf(name string, pm provider.Machine) (provider.Snapshotter, error) {
	sp, ok := pm.(provider.Snapshotter)
	if !ok {
		return nil, fmt.Errorf("provider %s advertises snapshots, but its machine does not take them: %w", name, provider.ErrUnsupported)
	}
	return sp, nil
}

// dropData deletes a snapshot's data at the provider, also when ctx is cancelled (a minute at
// most); a failure is logged: the data is orphaned, its record says why.
func (e *Engine) dropData(ctx context.Context, sp provider.Snapshotter, id, why string) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if err := sp.DeleteSnapshot(dctx, id); err != nil {
		e.log.WarnContext(ctx, "delete snapshot data "+why, "snapshot", id, "err", err)
	}
}

// machineOf returns the provider's machine a snapshot was taken of: the machine itself while
// kloud has it, else one built from what the snapshot recorded of it.
func (e *Engine) machineOf(ctx context.Context, sn *model.Snapshot) (provider.Snapshotter, error) {
	var pm provider.Machine
	m, err := e.o.Machines.Load(ctx, sn.MachineID)
	switch {
	case err == nil:
		pm, err = e.o.Machines.ProviderMachine(ctx, m)
	case errors.Is(err, kite.ErrNotFound):
		var p *provider.Provider
		if p, err = e.o.Providers.Lookup(sn.Provider); err != nil {
			return nil, fmt.Errorf("%s: %w", err.Error(), kite.ErrState)
		}
		pm, err = p.Machine(&provider.BaseMachine{ID: sn.MachineID, Label: sn.MachineLabel, StackID: sn.StackID, Provider: p,
			KiteID: sn.KiteID, Owner: sn.Owner, Attributes: sn.Attributes, Log: e.log.With("machine", sn.MachineID)})
	}
	if err != nil {
		return nil, err
	}
	if err := e.o.Machines.Capable(sn.Provider, api.MethodSnapshotDelete, provider.CapSnapshot); err != nil {
		return nil, err
	}
	return snapshotterOf(sn.Provider, pm)
}

// RunSnapshot is the machine.snapshot job: stop the machine if it runs, save its disk, start it
// again. Resumed after a kloud restart by running it again (recovering; each step is
// idempotent: a snapshot of the same id replaces what an interrupted one left).
func (e *Engine) RunSnapshot(ctx context.Context, j Job, p Params, recovering bool) (SnapshotResult, error) {
	snapID := p.SnapshotID
	var info provider.SnapshotInfo
	state, err := e.withMachineStopped(ctx, j, p, recovering, "snapshot", func(ctx context.Context, m *model.Machine, sp provider.Snapshotter) error {
		j.Progress(ctx, 40, string(provider.Stopped), "saving the disk")
		var err error
		if info, err = sp.Snapshot(ctx, snapID); err != nil {
			return fmt.Errorf("snapshot %s: %w", m.Label, err)
		}
		j.Logf(ctx, "disk of %s saved: %s (%s of data, %s)", m.Label, HumanBytes(info.Size), HumanBytes(info.DiskSize), info.Format)
		// The byte quota is known only now: a snapshot that takes the owner over it is dropped.
		n, b, err := e.o.Store.Snapshots().Usage(ctx, m.Owner)
		if err == nil {
			if q := e.Quota(); q.Bytes > 0 && b+info.Size > q.Bytes {
				e.dropData(ctx, sp, snapID, "over quota")
				return fmt.Errorf("the snapshot takes %s; with the %d others (%s) that is over %s's quota of %s: delete some first: %w",
					HumanBytes(info.Size), n-1, HumanBytes(b), m.Owner, HumanBytes(q.Bytes), kite.ErrTooLarge)
			}
		}
		ok, err := e.set(ctx, snapID, store.SnapshotSet{Status: new(model.SnapshotReady), Error: new(""),
			Size: &info.Size, DiskSize: &info.DiskSize, Format: &info.Format})
		if err == nil && !ok {
			// Its record is gone (deleted by hand in the store): so is its data.
			e.dropData(ctx, sp, snapID, "of a deleted record")
			err = fmt.Errorf("snapshot %s was deleted while it was being made", snapID)
		}
		return err
	})
	if err != nil {
		e.set(ctx, snapID, store.SnapshotSet{Status: new(model.SnapshotFailed), Error: new(err.Error())})
		// A failed snapshot holds no data.
		if sn, gerr := e.o.Store.Snapshots().Get(context.WithoutCancel(ctx), snapID); gerr == nil {
			if sp, merr := e.machineOf(context.WithoutCancel(ctx), &sn); merr == nil {
				e.dropData(ctx, sp, snapID, "of a failed snapshot")
			}
		}
		return SnapshotResult{}, err
	}
	return SnapshotResult{MachineID: p.MachineID, State: state, SnapshotID: snapID, Size: info.Size}, nil
}

// set changes snapshot id's record (bookkeeping: its own context, retried); ok is false when
// there is no such record.
func (e *Engine) set(ctx context.Context, id string, set store.SnapshotSet) (bool, error) {
	var ok bool
	err := e.o.Store.Persist(ctx, "update snapshot "+id, 0, func(ctx context.Context) error {
		var err error
		ok, err = e.o.Store.Snapshots().Set(ctx, id, nil, set)
		return err
	})
	if err != nil {
		e.log.ErrorContext(ctx, "update snapshot", "snapshot", id, "err", err)
	}
	return ok, err
}

// RunRestore is the machine.restore job: stop the machine if it runs, replace its disk by the
// snapshot's, start it again. Resumed after a restart by running it again.
func (e *Engine) RunRestore(ctx context.Context, j Job, p Params, recovering bool) (RestoreResult, error) {
	snapID := p.SnapshotID
	state, err := e.withMachineStopped(ctx, j, p, recovering, "restore", func(ctx context.Context, m *model.Machine, sp provider.Snapshotter) error {
		sn, err := e.o.Store.Snapshots().Get(ctx, snapID)
		if err != nil {
			return fmt.Errorf("snapshot %s: %w", snapID, err)
		}
		if sn.Status != model.SnapshotReady {
			return fmt.Errorf("snapshot %s is %s: %w", snapID, sn.Status, kite.ErrState)
		}
		j.Progress(ctx, 40, string(provider.Stopped), "restoring the disk")
		if err := sp.Restore(ctx, snapID); err != nil {
			return fmt.Errorf("restore %s: %w", m.Label, err)
		}
		j.Logf(ctx, "disk of %s restored from snapshot %q (%s, taken of %s at %s)", m.Label, sn.Name, sn.ID, sn.MachineLabel,
			sn.CreatedAt.Format(time.RFC3339))
		return nil
	})
	if err != nil {
		return RestoreResult{}, err
	}
	return RestoreResult{MachineID: p.MachineID, State: state, SnapshotID: snapID}, nil
}

// withMachineStopped runs fn on the job's machine while it is stopped: a machine that was
// Running (p.From) is stopped first and started again after, waiting for its agent. The job
// holds the machine's lease (p.Lease). On any error the machine is put in the state its
// provider reports. It returns the state the machine is left in.
func (e *Engine) withMachineStopped(ctx context.Context, j Job, p Params, recovering bool, what string,
	fn func(ctx context.Context, m *model.Machine, sp provider.Snapshotter) error) (_ provider.State, err error) {
	doc := j.Doc()
	id, owner, from := p.MachineID, p.Lease, p.From
	if recovering {
		if doc.CancelRequested {
			err = fmt.Errorf("cancelled while no kloud ran it: %w", store.ErrJobCancelled)
		} else if err = e.o.Leases.Retake(ctx, "machine/"+id, owner); err != nil {
			err = fmt.Errorf("machine %s: %w", id, err)
		}
		if err != nil {
			return "", err
		}
		j.Logf(ctx, "kloud restarted during this job; running it again")
	}
	defer e.o.Leases.Keep(context.Background(), "machine/"+id, owner)()
	m, err := e.o.Machines.Load(ctx, id)
	if err != nil {
		return "", err
	}
	var pm provider.Machine
	// No state without an exit: whatever happens, the machine ends in the state the provider
	// reports (asked with a context of its own, so a cancelled job still ends honestly).
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("internal error: %v", p)
		}
		if err == nil {
			return
		}
		if ctx.Err() != nil {
			err = fmt.Errorf("%s cancelled: %w", what, err)
		}
		ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		state := provider.Unknown
		if pm != nil {
			if st, _, ierr := pm.Info(ictx); ierr == nil {
				state = st
			}
		}
		e.o.Machines.Set(ictx, id, []provider.State{provider.Stopping, provider.Starting, provider.Stopped, provider.Running},
			store.MachineSet{State: new(string(state)), Reason: new(fmt.Sprintf("%s job %s: %v", what, doc.ID, err))})
	}()
	if err := e.o.Machines.Capable(m.Provider, "machine."+what, provider.CapSnapshot); err != nil {
		return "", err
	}
	if pm, err = e.o.Machines.ProviderMachine(ctx, m); err != nil {
		return "", err
	}
	sp, err := snapshotterOf(m.Provider, pm)
	if err != nil {
		return "", err
	}
	// Stop (a recovered job finds it stopped already, or half way: Stop is idempotent).
	if m.State != provider.Stopped {
		j.Enter(ctx, stackbuild.MachineStopping)
		e.o.Machines.Set(ctx, id, []provider.State{provider.Running, provider.Stopping, provider.Starting},
			store.MachineSet{State: new(string(provider.Stopping)), Reason: new("stopping for a " + what)})
		meta, err := pm.Stop(ctx)
		if err != nil {
			return "", fmt.Errorf("stop %s for the %s: %w", m.Label, what, err)
		}
		e.o.Machines.Set(ctx, id, []provider.State{provider.Stopping}, store.MachineSet{State: new(string(provider.Stopped)), Reason: new(""), Meta: meta})
		e.o.Machines.SetAgent(ctx, m.KiteID, model.AgentDisconnected, "")
	}
	ferr := fn(ctx, m, sp)
	if from != provider.Running {
		if ferr != nil {
			return "", ferr
		}
		j.Progress(ctx, 100, string(provider.Stopped), what+" done")
		return provider.Stopped, nil
	}
	// Started again whether fn worked or not (a failed snapshot must not leave the machine
	// down), also when the job was cancelled meanwhile.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.o.AgentTimeout+2*time.Minute)
	defer cancel()
	if err := e.startAgain(sctx, j, m, pm); err != nil {
		if ferr != nil {
			return "", fmt.Errorf("%w; starting %s again failed too: %w", ferr, m.Label, err)
		}
		return "", fmt.Errorf("%s done, but %w", what, err)
	}
	if ferr != nil {
		return "", fmt.Errorf("%w (%s is running again, as before)", ferr, m.Label)
	}
	return provider.Running, nil
}

// startAgain starts the job's machine after a snapshot or restore and waits for its agent.
func (e *Engine) startAgain(ctx context.Context, j Job, m *model.Machine, pm provider.Machine) error {
	j.Enter(ctx, stackbuild.MachineStarting)
	e.o.Machines.Set(ctx, m.ID, []provider.State{provider.Stopped}, store.MachineSet{State: new(string(provider.Starting)), Reason: new("")})
	meta, err := pm.Start(ctx)
	if err != nil {
		return fmt.Errorf("starting %s again failed: %w", m.Label, err)
	}
	j.Enter(ctx, stackbuild.MachineAgent)
	p, _ := e.o.Providers.Lookup(m.Provider)
	r := e.o.Planner().Wait(ctx, []stackbuild.Expect{{Label: m.Label, KiteID: m.KiteID, Machine: pm, Provider: p}}, nil)[0]
	if !r.OK {
		return fmt.Errorf("%s started again, but %s failed: %w", m.Label, r.Step, r.Err)
	}
	version := ""
	if r.Info != nil {
		version = r.Info.Version
	}
	e.o.Machines.SetAgent(ctx, m.KiteID, model.AgentConnected, version)
	e.o.Machines.Started(ctx, m.ID) // kloud's idle countdown: running again, a new one
	e.o.Machines.Set(ctx, m.ID, []provider.State{provider.Starting}, store.MachineSet{State: new(string(provider.Running)), Reason: new(""), Meta: meta})
	j.Enter(ctx, stackbuild.MachineStarted)
	return nil
}
