package snapshots

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/stackbuild"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/provider"
)

// Job kinds.
const (
	JobSnapshot = "machine.snapshot"
	JobRestore  = "machine.restore"
)

// Options configure an Engine. Store, Providers, Machines, Leases, Jobs and Planner are
// required.
type Options struct {
	Store     *store.Store       // the snapshots' records and the jobs'
	Providers *provider.Registry // a deleted machine's provider (snapshot.delete)
	Machines  Machines
	Leases    Leases
	Jobs      Jobs
	// Planner returns the planner that waits for a machine's agent once it is started again
	// (kloud's timeout, log and metrics).
	Planner func() *stackbuild.Planner
	// Quota limits each user's snapshots (zero fields: DefaultCount and DefaultBytes).
	Quota Quota
	// AgentTimeout is how long a machine's agent may take to come back (the start after a
	// snapshot or restore waits for it, and 2 minutes more).
	AgentTimeout time.Duration
	Logger       *slog.Logger // nil: discard
}

// Machines is what the engine asks of kloud about machines.
type Machines interface {
	// Load reads machine id (kite.ErrNotFound when there is none).
	Load(ctx context.Context, id string) (*model.Machine, error)
	// ProviderMachine is the provider's view of m, as its owner.
	ProviderMachine(ctx context.Context, m *model.Machine) (provider.Machine, error)
	// Capable fails with provider.ErrUnsupported (kite.ErrState for an unknown provider)
	// unless provider name has capability cap, which method needs.
	Capable(name, method string, cap provider.Capability) error
	// Set changes machine id; with from set, only if its state is one of them (bookkeeping:
	// written with its own context and retried).
	Set(ctx context.Context, id string, from []provider.State, set store.MachineSet) bool
	// SetAgent records a machine's agent status (the one writer of it).
	SetAgent(ctx context.Context, kiteID, status, version string)
	// Started tells kloud machine id runs again (its idle countdown starts anew).
	Started(ctx context.Context, id string)
}

// Leases are the store leases of machines (kloud/leases.go).
type Leases interface {
	// Take takes lease name for a new owner of kind; busy starts the error when someone else
	// holds it. release gives it back, for a caller that started no job after all.
	Take(ctx context.Context, name, kind, busy string) (owner string, release func(), err error)
	// Retake takes lease name for owner again, waiting a while if someone else holds it.
	Retake(ctx context.Context, name, owner string) error
	// Keep renews lease name until stop, then releases it.
	Keep(ctx context.Context, name, owner string) (stop func())
}

// Jobs starts durable jobs (kloud's job runner).
type Jobs interface {
	// Start creates job id ("": a new id) of kind on target for owner and runs it in the
	// background; it returns the job's id.
	Start(ctx context.Context, id, kind, target, owner string, p Params) (string, error)
}

// Params are a machine.snapshot or machine.restore job's params (job.get shows them).
type Params struct {
	MachineID  string         `json:"machineId"`
	SnapshotID string         `json:"snapshotId"` // the snapshot made, or restored from
	Lease      string         `json:"lease"`      // the owner name of the machine's lease the call took
	From       provider.State `json:"from"`       // the machine's state before the job
}

// SnapshotResult is a machine.snapshot job's result.
type SnapshotResult struct {
	MachineID  string         `json:"machineId"`
	State      provider.State `json:"state"`
	SnapshotID string         `json:"snapshotId"`
	Size       int64          `json:"size"` // bytes
}

// RestoreResult is a machine.restore job's result.
type RestoreResult struct {
	MachineID  string         `json:"machineId"`
	State      provider.State `json:"state"`
	SnapshotID string         `json:"snapshotId"`
}

// Job is the running job a snapshot or restore reports to (kloud's job context).
type Job interface {
	stackbuild.Job
	// Progress records the job's percentage, stage (a state name) and message.
	Progress(ctx context.Context, percent int, stage, message string)
}

// Engine takes, restores, lists and deletes snapshots.
type Engine struct {
	o   Options
	log *slog.Logger
}

// New returns the engine over o.
func New(o Options) *Engine {
	log := o.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Engine{o: o, log: log}
}

// Defaults of Quota.
const (
	DefaultCount = 10
	DefaultBytes = 20 << 30 // 20 GiB
)

// Quota limits each user's snapshots: how many and how many bytes (as the provider keeps
// them). Zero fields take DefaultCount and DefaultBytes; a negative field means no limit.
type Quota struct {
	Count int
	Bytes int64
}

// ParseScaled reads a number of 0 or more with an optional unit letter of units after it (its
// multiplier; "B" or "iB" after the letter ignored, any case): "20G", "512", "8GiB".
func ParseScaled(s string, units map[byte]int64) (int64, bool) {
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

// ParseQuota parses "COUNT,SIZE" (kloud serve --snapshot-quota): COUNT snapshots, SIZE bytes
// with an optional K, M, G or T suffix (powers of 1024, an optional "iB" or "B" after it);
// "unlimited" for either means no limit. "COUNT" alone keeps the default size.
func ParseQuota(s string) (Quota, error) {
	var q Quota
	cnt, size, _ := strings.Cut(strings.TrimSpace(s), ",")
	bad := func(why string) (Quota, error) {
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
		n, ok := ParseScaled(size, map[byte]int64{'K': 1 << 10, 'M': 1 << 20, 'G': 1 << 30, 'T': 1 << 40})
		if !ok || n <= 0 {
			return bad("the size is not a positive number of bytes")
		}
		q.Bytes = n
	}
	return q, nil
}

// Quota is the effective quota (api form: 0 means no limit).
func (e *Engine) Quota() api.SnapshotQuota {
	q := e.o.Quota
	out := api.SnapshotQuota{Count: q.Count, Bytes: q.Bytes}
	switch {
	case q.Count == 0:
		out.Count = DefaultCount
	case q.Count < 0:
		out.Count = 0
	}
	switch {
	case q.Bytes == 0:
		out.Bytes = DefaultBytes
	case q.Bytes < 0:
		out.Bytes = 0
	}
	return out
}

// checkQuota fails with -32008 when owner has more than q allows, counting extra snapshots
// already recorded beyond the one asked for (0 before recording it, 1 after).
func (e *Engine) checkQuota(ctx context.Context, owner string, q api.SnapshotQuota, recorded int) error {
	n, b, err := e.o.Store.Snapshots().Usage(ctx, owner)
	if err != nil {
		return err
	}
	if q.Count > 0 && n-recorded >= q.Count {
		return fmt.Errorf("%s has %d snapshots, the most this kloud allows (quota %d): delete one first (kloud snapshot delete ID): %w",
			owner, n-recorded, q.Count, kite.ErrTooLarge)
	}
	if q.Bytes > 0 && b >= q.Bytes {
		return fmt.Errorf("%s's snapshots take %s, the quota is %s: delete some first: %w", owner, HumanBytes(b), HumanBytes(q.Bytes), kite.ErrTooLarge)
	}
	return nil
}

// HumanBytes is n bytes for people: "512 B", "1.5 GiB".
func HumanBytes(n int64) string {
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
