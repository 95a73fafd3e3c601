package kloud

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/stackbuild"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/provider"
)

// Snapshots: machine.snapshot and machine.restore (durable jobs on the machine's lease,
// "machine/ID", so no start, stop or other snapshot runs meanwhile), machine.snapshots and
// snapshot.delete. The provider keeps the data (provider.Snapshotter); the store keeps a record
// per snapshot (kloud/store Snapshots) that belongs to the machine's owner and counts against the
// owner's quota (Options.SnapshotQuota). A provider snapshots and restores stopped machines only:
// the job stops a running machine first and starts it again after (waiting for its agent, as
// machine.start does), so the machine ends as it was.
//
// Snapshots outlive their machine and its stack: they stay listed, restorable into another
// machine of the same provider (machine.restore with machineId), and count against the quota
// until snapshot.delete, which asks the provider to delete the data through a machine built from
// what the record kept (the machine's attributes when the snapshot was taken).

// Job kinds.
const (
	jobMachineSnapshot = "machine.snapshot"
	jobMachineRestore  = "machine.restore"
)

// Defaults of Options.SnapshotQuota.
const (
	DefaultSnapshotCount = 10
	DefaultSnapshotBytes = 20 << 30 // 20 GiB
)

// SnapshotQuota limits each user's snapshots: how many and how many bytes (as the provider keeps
// them). Zero fields take DefaultSnapshotCount and DefaultSnapshotBytes; a negative field means
// no limit.
type SnapshotQuota struct {
	Count int
	Bytes int64
}

// parseScaled reads a number of 0 or more with an optional unit letter of units after it (its
// multiplier; "B" or "iB" after the letter ignored, any case): "20G", "512", "8GiB".
func parseScaled(s string, units map[byte]int64) (int64, bool) {
	num := strings.TrimSuffix(strings.TrimSuffix(strings.ToUpper(strings.TrimSpace(s)), "B"), "I")
	mult := int64(1)
	if i := len(num) - 1; i >= 0 && units[num[i]] != 0 {
		mult, num = units[num[i]], num[:i]
	}
	n, err := strconv.ParseInt(strings.TrimSpace(num), 10, 64)
	if err != nil || n < 0 {
		return 0, false
	}
	return n * mult, true
}

// ParseSnapshotQuota parses "COUNT,SIZE" (kloud serve --snapshot-quota): COUNT snapshots, SIZE
// bytes with an optional K, M, G or T suffix (powers of 1024, an optional "iB" or "B" after it);
// "unlimited" for either means no limit. "COUNT" alone keeps the default size.
func ParseSnapshotQuota(s string) (SnapshotQuota, error) {
	var q SnapshotQuota
	cnt, size, _ := strings.Cut(strings.TrimSpace(s), ",")
	bad := func(why string) (SnapshotQuota, error) {
		return q, fmt.Errorf("snapshot quota %q: %s (want COUNT,SIZE such as 10,20G; \"unlimited\" for no limit)", s, why)
	}
	switch c := strings.TrimSpace(cnt); c {
	case "unlimited":
		q.Count = -1
	default:
		n, err := strconv.Atoi(c)
		if err != nil || n <= 0 {
			return bad("the count is not a positive number")
		}
		q.Count = n
	}
	size = strings.TrimSpace(size)
	switch {
	case size == "":
	case size == "unlimited":
		q.Bytes = -1
	default:
		n, ok := parseScaled(size, map[byte]int64{'K': 1 << 10, 'M': 1 << 20, 'G': 1 << 30, 'T': 1 << 40})
		if !ok || n <= 0 {
			return bad("the size is not a positive number of bytes")
		}
		q.Bytes = n
	}
	return q, nil
}

// snapshotQuota is the effective quota (api form: 0 means no limit).
func (s *Server) snapshotQuota() api.SnapshotQuota {
	q := s.opts.SnapshotQuota
	out := api.SnapshotQuota{Count: q.Count, Bytes: q.Bytes}
	switch {
	case q.Count == 0:
		out.Count = DefaultSnapshotCount
	case q.Count < 0:
		out.Count = 0
	}
	switch {
	case q.Bytes == 0:
		out.Bytes = DefaultSnapshotBytes
	case q.Bytes < 0:
		out.Bytes = 0
	}
	return out
}

// mayManage reports whether c may snapshot or restore machine m: its owner, a team admin, or a
// user it is shared with "full" (who may do anything the owner can).
func (c *Caller) mayManage(m *Machine) bool {
	return m.Owner == c.Username || c.TeamAdmin(m.Team) || hasGrant(m, c.Username, GrantFull)
}

// snapshotFrom is where a snapshot or restore may start from.
var snapshotFrom = []provider.State{provider.Running, provider.Stopped}

// leaseSettled takes machine m's lease for a snapshot or restore job of kind and reads the
// machine again under it (no job changes it now); it must be Running or Stopped (how names the
// operation for that message: "taken of", "restored into"). The caller starts the job with
// owner as its "lease" param, or calls release.
func (s *Server) leaseSettled(ctx context.Context, m *Machine, kind, how string) (_ *Machine, owner string, release func(), err error) {
	owner, release, err = s.takeLease(ctx, "machine/"+m.ID, kind, "machine "+m.Label+" is busy")
	if err != nil {
		return nil, "", nil, err
	}
	if m, err = s.loadMachine(ctx, nil, m.ID); err != nil {
		release()
		return nil, "", nil, err
	}
	if !stateIn(m.State, snapshotFrom) {
		release()
		return nil, "", nil, fmt.Errorf("machine %s is %s; a snapshot is %s a Running or Stopped machine: %w", m.Label, m.State, how, kite.ErrState)
	}
	return m, owner, release, nil
}

// snapshotterOf returns provider machine pm as a Snapshotter (the provider advertises snapshots).
func snapshotterOf(name string, pm provider.Machine) (provider.Snapshotter, error) {
	sp, ok := pm.(provider.Snapshotter)
	if !ok {
		return nil, fmt.Errorf("provider %s advertises snapshots, but its machine does not take them: %w", name, provider.ErrUnsupported)
	}
	return sp, nil
}

// dropSnapshotData deletes a snapshot's data at the provider, also when ctx is cancelled (a
// minute at most); a failure is logged: the data is orphaned, its record says why.
func (s *Server) dropSnapshotData(ctx context.Context, sp provider.Snapshotter, id, why string) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if err := sp.DeleteSnapshot(dctx, id); err != nil {
		s.log.WarnContext(ctx, "delete snapshot data "+why, "snapshot", id, "err", err)
	}
}

func (s *Server) machineSnapshot(ctx context.Context, c *Caller, _ *kite.Request, p *api.SnapshotParams) (api.SnapshotStarted, error) {
	m, err := s.loadMachine(ctx, c, p.MachineID)
	if err != nil {
		return api.SnapshotStarted{}, err
	}
	if !c.mayManage(m) {
		return api.SnapshotStarted{}, fmt.Errorf("only the owner may snapshot machine %s: %w", m.Label, kite.ErrPermission)
	}
	if err := s.capable(m.Provider, api.MethodMachineSnapshot, provider.CapSnapshot); err != nil {
		return api.SnapshotStarted{}, err
	}
	name := strings.TrimSpace(p.Name)
	if name == "" {
		name = m.Label + " " + s.store.Now().Format("2006-01-02 15:04:05")
	}
	q := s.snapshotQuota()
	if err := s.checkSnapshotQuota(ctx, m.Owner, q, 0); err != nil {
		return api.SnapshotStarted{}, err
	}
	m, owner, release, err := s.leaseSettled(ctx, m, "snapshot", "taken of")
	if err != nil {
		return api.SnapshotStarted{}, err
	}
	// The job's id is recorded with the snapshot, so snapshot.delete always sees that it runs.
	jobID := store.NewID()
	sn := store.Snapshot{
		ID: store.NewID(), Name: name, Owner: m.Owner, Team: m.Team, MachineID: m.ID, MachineLabel: m.Label,
		StackID: m.StackID, Provider: m.Provider, Status: store.SnapshotCreating, KiteID: m.KiteID, Attributes: m.Attributes,
		JobID: jobID,
	}
	if err := s.store.Snapshots().Insert(ctx, sn); err != nil {
		release()
		return api.SnapshotStarted{}, err
	}
	// Two requests racing past the first check: the one over the count gives way.
	if err := s.checkSnapshotQuota(ctx, m.Owner, q, 1); err != nil {
		s.store.Snapshots().Delete(context.WithoutCancel(ctx), sn.ID)
		release()
		return api.SnapshotStarted{}, err
	}
	id, err := snapshotJob.StartID(ctx, s, jobID, "machine/"+m.ID, c.Username,
		snapshotParams{MachineID: m.ID, SnapshotID: sn.ID, Lease: owner, From: m.State})
	if err != nil {
		s.store.Snapshots().Delete(context.WithoutCancel(ctx), sn.ID)
		release()
		return api.SnapshotStarted{}, err
	}
	return api.SnapshotStarted{JobID: id, SnapshotID: sn.ID}, nil
}

// checkSnapshotQuota fails with -32008 when owner has more than q allows, counting extra
// snapshots already recorded beyond the one asked for (0 before recording it, 1 after).
func (s *Server) checkSnapshotQuota(ctx context.Context, owner string, q api.SnapshotQuota, recorded int) error {
	n, b, err := s.store.Snapshots().Usage(ctx, owner)
	if err != nil {
		return err
	}
	if q.Count > 0 && n-recorded >= q.Count {
		return fmt.Errorf("%s has %d snapshots, the most this kloud allows (quota %d): delete one first (kloud snapshot delete ID): %w",
			owner, n-recorded, q.Count, kite.ErrTooLarge)
	}
	if q.Bytes > 0 && b >= q.Bytes {
		return fmt.Errorf("%s's snapshots take %s, the quota is %s: delete some first: %w", owner, humanBytes(b), humanBytes(q.Bytes), kite.ErrTooLarge)
	}
	return nil
}

func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for x := n / unit; x >= unit; x /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

func stateIn(st provider.State, in []provider.State) bool {
	for _, x := range in {
		if st == x {
			return true
		}
	}
	return false
}

// loadSnapshot returns snapshot id if c may use it (its owner, kloud admins), else not found.
func (s *Server) loadSnapshot(ctx context.Context, c *Caller, id string) (*store.Snapshot, error) {
	sn, err := s.store.Snapshots().Get(ctx, id)
	if errors.Is(err, store.ErrNotFound) || err == nil && sn.Owner != c.Username && !c.Admin {
		return nil, notFound("snapshot", id)
	}
	if err != nil {
		return nil, err
	}
	return &sn, nil
}

func (s *Server) machineSnapshots(ctx context.Context, c *Caller, _ *kite.Request, p *api.SnapshotsParams) (api.SnapshotsResult, error) {
	all, err := s.store.Snapshots().List(ctx, store.SnapshotFilter{Owner: c.Username})
	if err != nil {
		return api.SnapshotsResult{}, err
	}
	out := api.SnapshotsResult{Snapshots: []api.Snapshot{}, Quota: s.snapshotQuota()}
	for _, sn := range all {
		out.Used.Count++
		out.Used.Bytes += sn.Size
		if p.MachineID == "" || sn.MachineID == p.MachineID {
			out.Snapshots = append(out.Snapshots, sn)
		}
	}
	return out, nil
}

func (s *Server) machineRestore(ctx context.Context, c *Caller, _ *kite.Request, p *api.RestoreParams) (api.JobRef, error) {
	sn, err := s.loadSnapshot(ctx, c, p.SnapshotID)
	if err != nil {
		return api.JobRef{}, err
	}
	if sn.Status != store.SnapshotReady {
		return api.JobRef{}, fmt.Errorf("snapshot %s is %s, only a ready snapshot can be restored: %w", sn.ID, sn.Status, kite.ErrState)
	}
	target := p.MachineID
	if target == "" {
		target = sn.MachineID
	}
	m, err := s.loadMachine(ctx, c, target)
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
	if m.Provider != sn.Provider {
		return api.JobRef{}, fmt.Errorf("snapshot %s is of a %s machine; machine %s is %s: restore it into a %s machine: %w",
			sn.ID, sn.Provider, m.Label, m.Provider, sn.Provider, kite.ErrInvalidParams)
	}
	if err := s.capable(m.Provider, api.MethodMachineRestore, provider.CapSnapshot); err != nil {
		return api.JobRef{}, err
	}
	m, owner, release, err := s.leaseSettled(ctx, m, "restore", "restored into")
	if err != nil {
		return api.JobRef{}, err
	}
	id, err := restoreJob.Start(ctx, s, "machine/"+m.ID, c.Username,
		snapshotParams{MachineID: m.ID, SnapshotID: sn.ID, Lease: owner, From: m.State})
	if err != nil {
		release()
		return api.JobRef{}, err
	}
	return api.JobRef{JobID: id}, nil
}

func (s *Server) snapshotDelete(ctx context.Context, c *Caller, _ *kite.Request, p *api.SnapshotRef) (api.Snapshot, error) {
	sn, err := s.loadSnapshot(ctx, c, p.SnapshotID)
	if err != nil {
		return api.Snapshot{}, err
	}
	if sn.Status == store.SnapshotCreating && sn.JobID != "" {
		if j, err := s.store.Jobs().Get(ctx, sn.JobID); err == nil && !j.Status.Done() {
			return api.Snapshot{}, fmt.Errorf("snapshot %s is being made (job %s): wait for it or cancel the job first: %w", sn.ID, sn.JobID, kite.ErrConflict)
		}
	}
	pm, err := s.snapshotMachine(ctx, sn)
	if err != nil {
		return api.Snapshot{}, fmt.Errorf("delete snapshot %s: %w", sn.ID, err)
	}
	if err := pm.DeleteSnapshot(ctx, sn.ID); err != nil {
		return api.Snapshot{}, fmt.Errorf("delete snapshot %s: %w", sn.ID, err)
	}
	if err := s.store.Snapshots().Delete(ctx, sn.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
		return api.Snapshot{}, err
	}
	s.log.InfoContext(ctx, "snapshot deleted", "snapshot", sn.ID, "owner", sn.Owner, "by", c.Username)
	return *sn, nil
}

// snapshotMachine returns the provider's machine a snapshot was taken of: the machine itself
// while kloud has it, else one built from what the snapshot recorded of it.
func (s *Server) snapshotMachine(ctx context.Context, sn *store.Snapshot) (provider.Snapshotter, error) {
	var pm provider.Machine
	m, err := s.loadMachine(ctx, nil, sn.MachineID)
	switch {
	case err == nil:
		pm, err = s.providerMachine(ctx, nil, m)
	case errors.Is(err, kite.ErrNotFound):
		var p *provider.Provider
		if p, err = s.providers.Lookup(sn.Provider); err != nil {
			return nil, fmt.Errorf("%s: %w", err.Error(), kite.ErrState)
		}
		pm, err = p.Machine(&provider.BaseMachine{ID: sn.MachineID, Label: sn.MachineLabel, StackID: sn.StackID, Provider: p,
			KiteID: sn.KiteID, Owner: sn.Owner, Attributes: sn.Attributes, Log: s.log.With("machine", sn.MachineID)})
	}
	if err != nil {
		return nil, err
	}
	if err := s.capable(sn.Provider, api.MethodSnapshotDelete, provider.CapSnapshot); err != nil {
		return nil, err
	}
	return snapshotterOf(sn.Provider, pm)
}

// snapshotParams are a machine.snapshot or machine.restore job's params (job.get shows them).
type snapshotParams struct {
	MachineID  string         `json:"machineId"`
	SnapshotID string         `json:"snapshotId"` // the snapshot made, or restored from
	Lease      string         `json:"lease"`      // the owner name of the machine's lease the call took
	From       provider.State `json:"from"`       // the machine's state before the job
}

// snapshotResult is a machine.snapshot job's result.
type snapshotResult struct {
	MachineID  string         `json:"machineId"`
	State      provider.State `json:"state"`
	SnapshotID string         `json:"snapshotId"`
	Size       int64          `json:"size"` // bytes
}

// restoreResult is a machine.restore job's result.
type restoreResult struct {
	MachineID  string         `json:"machineId"`
	State      provider.State `json:"state"`
	SnapshotID string         `json:"snapshotId"`
}

// runMachineSnapshot is the machine.snapshot job: stop the machine if it runs, save its disk,
// start it again. Resumed after a kloud restart by running it again (each step is idempotent:
// a snapshot of the same id replaces what an interrupted one left).
func (s *Server) runMachineSnapshot(ctx context.Context, j *jobCtx, p snapshotParams, recovering bool) (snapshotResult, error) {
	snapID := p.SnapshotID
	var info provider.SnapshotInfo
	res, err := s.withMachineStopped(ctx, j, p, recovering, "snapshot", func(ctx context.Context, m *Machine, sp provider.Snapshotter) error {
		j.Progress(ctx, 40, string(provider.Stopped), "saving the disk")
		var err error
		if info, err = sp.Snapshot(ctx, snapID); err != nil {
			return fmt.Errorf("snapshot %s: %w", m.Label, err)
		}
		j.Logf(ctx, "disk of %s saved: %s (%s of data, %s)", m.Label, humanBytes(info.Size), humanBytes(info.DiskSize), info.Format)
		// The byte quota is known only now: a snapshot that takes the owner over it is dropped.
		n, b, err := s.store.Snapshots().Usage(ctx, m.Owner)
		if err == nil {
			if q := s.snapshotQuota(); q.Bytes > 0 && b+info.Size > q.Bytes {
				s.dropSnapshotData(ctx, sp, snapID, "over quota")
				return fmt.Errorf("the snapshot takes %s; with the %d others (%s) that is over %s's quota of %s: delete some first: %w",
					humanBytes(info.Size), n-1, humanBytes(b), m.Owner, humanBytes(q.Bytes), kite.ErrTooLarge)
			}
		}
		ok, err := s.snapshotSet(ctx, snapID, store.SnapshotSet{Status: new(store.SnapshotReady), Error: new(""),
			Size: &info.Size, DiskSize: &info.DiskSize, Format: &info.Format})
		if err == nil && !ok {
			// Its record is gone (deleted by hand in the store): so is its data.
			s.dropSnapshotData(ctx, sp, snapID, "of a deleted record")
			err = fmt.Errorf("snapshot %s was deleted while it was being made", snapID)
		}
		return err
	})
	if err != nil {
		s.snapshotSet(ctx, snapID, store.SnapshotSet{Status: new(store.SnapshotFailed), Error: new(err.Error())})
		// A failed snapshot holds no data.
		if sn, gerr := s.store.Snapshots().Get(context.WithoutCancel(ctx), snapID); gerr == nil {
			if sp, merr := s.snapshotMachine(context.WithoutCancel(ctx), &sn); merr == nil {
				s.dropSnapshotData(ctx, sp, snapID, "of a failed snapshot")
			}
		}
		return snapshotResult{}, err
	}
	return snapshotResult{MachineID: res.MachineID, State: res.State, SnapshotID: snapID, Size: info.Size}, nil
}

func (s *Server) snapshotSet(ctx context.Context, id string, set store.SnapshotSet) (bool, error) {
	var ok bool
	err := s.store.Persist(ctx, "update snapshot "+id, 0, func(ctx context.Context) error {
		var err error
		ok, err = s.store.Snapshots().Set(ctx, id, nil, set)
		return err
	})
	if err != nil {
		s.log.ErrorContext(ctx, "update snapshot", "snapshot", id, "err", err)
	}
	return ok, err
}

// runMachineRestore is the machine.restore job: stop the machine if it runs, replace its disk by
// the snapshot's, start it again. Resumed after a restart by running it again.
func (s *Server) runMachineRestore(ctx context.Context, j *jobCtx, p snapshotParams, recovering bool) (restoreResult, error) {
	snapID := p.SnapshotID
	res, err := s.withMachineStopped(ctx, j, p, recovering, "restore", func(ctx context.Context, m *Machine, sp provider.Snapshotter) error {
		sn, err := s.store.Snapshots().Get(ctx, snapID)
		if err != nil {
			return fmt.Errorf("snapshot %s: %w", snapID, err)
		}
		if sn.Status != store.SnapshotReady {
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
		return restoreResult{}, err
	}
	return restoreResult{MachineID: res.MachineID, State: res.State, SnapshotID: snapID}, nil
}

// withMachineStopped runs fn on the job's machine while it is stopped: a machine that was
// Running (p.From) is stopped first and started again after, waiting for its agent. The job
// holds the machine's lease (p.Lease). On any error the machine is put in the state its
// provider reports.
func (s *Server) withMachineStopped(ctx context.Context, j *jobCtx, p snapshotParams, recovering bool, what string,
	fn func(ctx context.Context, m *Machine, sp provider.Snapshotter) error) (res machineResult, err error) {
	id, owner, from := p.MachineID, p.Lease, p.From
	if recovering {
		if j.CancelRequested {
			err = fmt.Errorf("cancelled while no kloud ran it: %w", store.ErrJobCancelled)
		} else if err = s.retakeLease(ctx, "machine/"+id, owner); err != nil {
			err = fmt.Errorf("machine %s: %w", id, err)
		}
		if err != nil {
			return machineResult{}, err
		}
		j.Logf(ctx, "kloud restarted during this job; running it again")
	}
	defer s.keepLease(context.Background(), "machine/"+id, owner)()
	m, err := s.loadMachine(ctx, nil, id)
	if err != nil {
		return machineResult{}, err
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
		s.setMachine(ictx, id, []provider.State{provider.Stopping, provider.Starting, provider.Stopped, provider.Running},
			store.MachineSet{State: new(string(state)), Reason: new(fmt.Sprintf("%s job %s: %v", what, j.ID, err))})
	}()
	if err := s.capable(m.Provider, "machine."+what, provider.CapSnapshot); err != nil {
		return machineResult{}, err
	}
	if pm, err = s.providerMachine(ctx, nil, m); err != nil {
		return machineResult{}, err
	}
	sp, err := snapshotterOf(m.Provider, pm)
	if err != nil {
		return machineResult{}, err
	}
	// Stop (a recovered job finds it stopped already, or half way: Stop is idempotent).
	if m.State != provider.Stopped {
		j.Enter(ctx, stackbuild.MachineStopping)
		s.setMachine(ctx, id, []provider.State{provider.Running, provider.Stopping, provider.Starting},
			store.MachineSet{State: new(string(provider.Stopping)), Reason: new("stopping for a " + what)})
		meta, err := pm.Stop(ctx)
		if err != nil {
			return machineResult{}, fmt.Errorf("stop %s for the %s: %w", m.Label, what, err)
		}
		s.setMachine(ctx, id, []provider.State{provider.Stopping}, store.MachineSet{State: new(string(provider.Stopped)), Reason: new(""), Meta: meta})
		s.setAgent(ctx, m.KiteID, AgentDisconnected, "")
	}
	ferr := fn(ctx, m, sp)
	res = machineResult{MachineID: id, State: provider.Stopped}
	if from != provider.Running {
		if ferr != nil {
			return machineResult{}, ferr
		}
		j.Progress(ctx, 100, string(provider.Stopped), what+" done")
		return res, nil
	}
	// Started again whether fn worked or not (a failed snapshot must not leave the machine
	// down), also when the job was cancelled meanwhile.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.AgentTimeout+2*time.Minute)
	defer cancel()
	if err := s.startAgain(sctx, j, m, pm); err != nil {
		if ferr != nil {
			return machineResult{}, fmt.Errorf("%w; starting %s again failed too: %w", ferr, m.Label, err)
		}
		return machineResult{}, fmt.Errorf("%s done, but %w", what, err)
	}
	if ferr != nil {
		return machineResult{}, fmt.Errorf("%w (%s is running again, as before)", ferr, m.Label)
	}
	res.State = provider.Running
	return res, nil
}

// startAgain starts the job's machine after a snapshot or restore and waits for its agent.
func (s *Server) startAgain(ctx context.Context, j *jobCtx, m *Machine, pm provider.Machine) error {
	j.Enter(ctx, stackbuild.MachineStarting)
	s.setMachine(ctx, m.ID, []provider.State{provider.Stopped}, store.MachineSet{State: new(string(provider.Starting)), Reason: new("")})
	meta, err := pm.Start(ctx)
	if err != nil {
		return fmt.Errorf("starting %s again failed: %w", m.Label, err)
	}
	j.Enter(ctx, stackbuild.MachineAgent)
	pl := s.planner()
	r := pl.Wait(ctx, []stackbuild.Expect{{Label: m.Label, KiteID: m.KiteID, Machine: pm, Provider: s.providerOf(m.Provider)}}, nil)[0]
	if !r.OK {
		return fmt.Errorf("%s started again, but %s failed: %w", m.Label, r.Step, r.Err)
	}
	version := ""
	if r.Info != nil {
		version = r.Info.Version
	}
	s.setAgent(ctx, m.KiteID, AgentConnected, version)
	s.restartCountdown(ctx, m.ID) // idle.go: running again, a new countdown
	s.setMachine(ctx, m.ID, []provider.State{provider.Starting}, store.MachineSet{State: new(string(provider.Running)), Reason: new(""), Meta: meta})
	j.Enter(ctx, stackbuild.MachineStarted)
	return nil
}
