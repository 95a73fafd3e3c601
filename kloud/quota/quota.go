// Package quota computes the quotas (issue 19): per user and per team limits on machines,
// cores, memory (MB) and disk (MB), set by kloud administrators (quota.set; kloud/store Quotas,
// one document per subject; none: no limit). The use of a subject is what its stacks that are
// built or being built hold (every stack but NotInitialized ones; a stack's machines but
// Terminated ones): a machine's cores, memory and disk are its planned attributes as its
// provider's constraints vocabulary names them (provider.ConstraintCores, Mem, Disk; without a
// vocabulary: cpus or cores, memory, disk_mb). stack.plan and stack.create check that the
// planned machines fit ([Keeper.Check]); stack.apply, stack.update and stack.scale check it and
// hold the owner's (and team's) quota lease until the stack is Building ([Keeper.Hold],
// [Keeper.Apply]), so the check and the reservation are one step: concurrent applies of one
// user never build more than the quota. A refusal is -32008 (too large, data type
// api.QuotaCode) naming the limit, the use and the request, before any job or change.
//
// Bucket quotas (issue 21) limit the bucket claims (model.BucketClaim) a user's or a team's
// stacks hold, and the MB they claim (the sum of their max_size_mb, which the S3 server
// enforces per bucket): [Keeper.CheckBuckets], called by stack.plan and stack.create and by the
// build stage before it provisions. Under a limit of MB a claim must say its max_size_mb.
//
// Start reading at [New] and [Options]: the keeper reads the store's repositories and the
// provider registry, never kloud's Server, and it does not import package kloud (a test keeps
// it so). kloud checks who may see or set a subject's quota (kloud/quota.go) and calls it.
package quota

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/provider"
)

// Options configure a Keeper. Store and Providers are required.
type Options struct {
	Store     *store.Store       // stacks, machines, the quotas set and their leases
	Providers *provider.Registry // the providers' constraints vocabularies
	// Default is the quota of every user an administrator gave none (zero: no limit).
	Default api.Quota
	// LeaseTTL is how long a quota lease lasts when its holder dies (0: a minute).
	LeaseTTL time.Duration
	Logger   *slog.Logger // nil: discard
}

// Keeper computes and checks the quotas.
type Keeper struct {
	o   Options
	log *slog.Logger
}

// New returns the keeper over o.
func New(o Options) *Keeper {
	log := o.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if o.LeaseTTL <= 0 {
		o.LeaseTTL = time.Minute
	}
	return &Keeper{o: o, log: log}
}

// Subjects are the quota documents' ids of owner and team. The stacks of model.PoolOwner
// (prebuilt stacks no user claimed yet) count against their team's pool quota "pool/<team>"
// only: never a user's, nor the team's, whose members' stacks the pool would otherwise crowd
// out. A claimed stack is its user's and counts against the user's and the team's quotas.
func Subjects(owner, team string) []string {
	if owner == model.PoolOwner {
		return []string{"pool/" + team}
	}
	return []string{"user/" + owner, "team/" + team}
}

// Add is a and b together.
func Add(a, b api.Quota) api.Quota {
	return api.Quota{Machines: a.Machines + b.Machines, Cores: a.Cores + b.Cores, MemoryMB: a.MemoryMB + b.MemoryMB, DiskMB: a.DiskMB + b.DiskMB,
		Buckets: a.Buckets + b.Buckets, BucketMB: a.BucketMB + b.BucketMB}
}

// FromStore is the quota of document d.
func FromStore(d store.Quota) api.Quota {
	return api.Quota{Machines: d.Machines, Cores: d.Cores, MemoryMB: d.MemoryMB, DiskMB: d.DiskMB, Buckets: d.Buckets, BucketMB: d.BucketMB}
}

// ClaimMB is the MB claim c takes of a bucket quota: its max size, rounded up.
func ClaimMB(c model.BucketClaim) int64 { return (c.MaxBytes + 1<<20 - 1) >> 20 }

// claimsHeld is what claims take of a bucket quota (Buckets and BucketMB).
func claimsHeld(cs []model.BucketClaim) api.Quota {
	var q api.Quota
	for _, c := range cs {
		q.Buckets++
		q.BucketMB += ClaimMB(c)
	}
	return q
}

// Need is what one machine of provider name with planned attributes takes of a quota.
func (k *Keeper) Need(name string, attrs map[string]any) api.Quota {
	attr := map[string][]string{
		provider.ConstraintCores: {"cpus", "cores"},
		provider.ConstraintMem:   {"memory"},
		provider.ConstraintDisk:  {"disk_mb"},
	}
	if p, err := k.o.Providers.Lookup(name); err == nil && p.Constraints != nil {
		for _, c := range p.Constraints() {
			if _, ok := attr[c.Name]; ok && c.Attribute != "" {
				attr[c.Name] = []string{c.Attribute}
			}
		}
	}
	num := func(name string) float64 {
		for _, a := range attr[name] {
			if f, ok := provider.Number(attrs[a]); ok {
				return f
			}
		}
		return 0
	}
	return api.Quota{Machines: 1, Cores: num(provider.ConstraintCores), MemoryMB: int64(num(provider.ConstraintMem)), DiskMB: int64(num(provider.ConstraintDisk))}
}

// plannedNeed is what planned machines take.
func (k *Keeper) plannedNeed(ms []api.PlannedMachine) api.Quota {
	var n api.Quota
	for _, m := range ms {
		n = Add(n, k.Need(m.Provider, m.Attributes))
	}
	return n
}

// Held is what stack st with machines ms holds of its owner's and team's quotas: nothing
// before it was built, else its machines but terminated ones.
func (k *Keeper) Held(st *model.Stack, ms []model.Machine) api.Quota {
	var held api.Quota
	if st.State == model.StackNotInitialized {
		return held
	}
	for _, m := range ms {
		if m.State != provider.Terminated {
			held = Add(held, k.Need(m.Provider, m.Attributes))
		}
	}
	return held
}

// stackHeld is Held of stack st, its machines read.
func (k *Keeper) stackHeld(ctx context.Context, st *model.Stack) (api.Quota, error) {
	if st.State == model.StackNotInitialized {
		return api.Quota{}, nil
	}
	ms, err := k.o.Store.Machines().ByStack(ctx, st.ID)
	if err != nil {
		return api.Quota{}, err
	}
	return k.Held(st, ms), nil
}

// use is what subject's stacks hold (built or being built), but stack except's: their
// machines, and the bucket claims of all its stacks (a claim exists from the build stage
// that provisions it until its stack's destroy ends it).
func (k *Keeper) use(ctx context.Context, subject, except string) (api.Quota, error) {
	var f store.StackFilter
	kind, name, _ := strings.Cut(subject, "/")
	switch kind {
	case "user":
		f.Owner = name
	case "pool": // a team's pools: its stacks no user claimed yet
		f.Owner, f.Team = model.PoolOwner, name
	default:
		f.Team = name
	}
	// A team's quota counts its members' stacks, not its pools' (Subjects).
	other := func(owner string) bool { return kind == "team" && owner == model.PoolOwner }
	claims, err := k.o.Store.BucketClaims().Held(ctx, f.Owner, f.Team)
	if err != nil {
		return api.Quota{}, fmt.Errorf("quota use of %s: %w", subject, err)
	}
	claims = slices.DeleteFunc(claims, func(c model.BucketClaim) bool { return c.StackID == except || other(c.Owner) })
	sts, err := k.o.Store.Stacks().List(ctx, f)
	if err != nil {
		return api.Quota{}, fmt.Errorf("quota use of %s: %w", subject, err)
	}
	use := claimsHeld(claims)
	for _, st := range sts {
		if st.ID == except || other(st.Owner) {
			continue
		}
		held, err := k.stackHeld(ctx, &st)
		if err != nil {
			return api.Quota{}, fmt.Errorf("quota use of %s: %w", subject, err)
		}
		use = Add(use, held)
	}
	return use, nil
}

// Of returns subject's quota (ok false: no limit): the one an administrator set, else for a
// user the default quota (Options.Default). A quota set with every limit 0 is no limit, also
// when there is a default.
func (k *Keeper) Of(ctx context.Context, subject string) (q api.Quota, ok bool, err error) {
	d, err := k.o.Store.Quotas().Get(ctx, subject)
	if errors.Is(err, store.ErrNotFound) {
		if strings.HasPrefix(subject, "user/") {
			return k.o.Default, k.o.Default != (api.Quota{}), nil
		}
		return api.Quota{}, false, nil
	}
	if err != nil {
		return api.Quota{}, false, err
	}
	q = FromStore(d)
	return q, q != (api.Quota{}), nil
}

// Check refuses planned machines of owner's stack except (""; a new stack) in team that would
// take owner or team above its quota. What the stack holds already is never refused (a stack
// over a lowered quota may scale down or be rebuilt).
func (k *Keeper) Check(ctx context.Context, owner, team, except string, planned []api.PlannedMachine) error {
	need := k.plannedNeed(planned)
	var held api.Quota
	if except != "" {
		st, err := k.o.Store.Stacks().Get(ctx, except)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		if err == nil {
			if held, err = k.stackHeld(ctx, &st); err != nil {
				return err
			}
		}
	}
	for _, sub := range Subjects(owner, team) {
		limit, ok, err := k.Of(ctx, sub)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		use, err := k.use(ctx, sub, except)
		if err != nil {
			return err
		}
		if err := Exceeded(sub, limit, use, need, held); err != nil {
			return err
		}
	}
	return nil
}

// Exceeded is the refusal of need on top of use under limit (nil: it fits); a resource whose
// need is no more than what the stack holds already (held) is not refused.
func Exceeded(subject string, limit, use, need, held api.Quota) error {
	type dim struct {
		name, unit             string
		limit, use, need, held float64
	}
	var over []string
	for _, d := range []dim{
		{"machines", "", float64(limit.Machines), float64(use.Machines), float64(need.Machines), float64(held.Machines)},
		{"cores", "", limit.Cores, use.Cores, need.Cores, held.Cores},
		{"memory", " MB", float64(limit.MemoryMB), float64(use.MemoryMB), float64(need.MemoryMB), float64(held.MemoryMB)},
		{"disk", " MB", float64(limit.DiskMB), float64(use.DiskMB), float64(need.DiskMB), float64(held.DiskMB)},
	} {
		if d.limit > 0 && d.use+d.need > d.limit && d.need > d.held {
			f := func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) + d.unit }
			over = append(over, fmt.Sprintf("%s: the limit is %s, %s in use, this asks for %s", d.name, f(d.limit), f(d.use), f(d.need)))
		}
	}
	if len(over) == 0 {
		return nil
	}
	kind, name, _ := strings.Cut(subject, "/")
	return &kite.Error{Code: kite.CodeTooLarge, Data: &kite.ErrorData{Type: api.QuotaCode},
		Message: fmt.Sprintf("quota of %s %s exceeded: %s (destroy a stack first, or an administrator raises it with `kloud quota set --%s %s`)",
			kind, name, strings.Join(over, "; "), kind, name)}
}

// leaseWait bounds how long a call waits for another call of the same subject that holds its
// quota lease (a plan of an update may take that long).
const leaseWait = 2 * time.Minute

// Hold takes the quota leases of owner and team, for the subjects that have a quota, so that no
// other apply, update or scale of theirs checks its quota until release (called once the stack
// is Building, when the use counts it).
func (k *Keeper) Hold(ctx context.Context, owner, team string) (release func(), err error) {
	var leases []*store.Lease
	release = func() {
		for _, l := range leases {
			if err := k.o.Store.Persist(ctx, "release lease "+l.Name, 30*time.Second, l.Release); err != nil {
				k.log.WarnContext(ctx, "release quota lease (it lapses by itself)", "lease", l.Name, "err", err)
			}
		}
	}
	id := "quota-" + store.NewID()
	for _, sub := range Subjects(owner, team) {
		if _, ok, err := k.Of(ctx, sub); err != nil || !ok {
			if err != nil {
				release()
				return nil, err
			}
			continue
		}
		deadline := time.Now().Add(leaseWait)
		for {
			l, err := k.o.Store.AcquireLease(ctx, "quota/"+sub, id, k.o.LeaseTTL)
			if err == nil {
				leases = append(leases, l)
				break
			}
			if !errors.Is(err, store.ErrLocked) || time.Now().After(deadline) {
				release()
				return nil, fmt.Errorf("quota of %s is busy with another call: %w", sub, err)
			}
			select {
			case <-ctx.Done():
				release()
				return nil, ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return release, nil
}

// Apply is stack.apply's check of a stack that was never built: its recorded machines under
// owner's and team's quotas, with the quota leases held until release.
func (k *Keeper) Apply(ctx context.Context, st *model.Stack) (release func(), err error) {
	if release, err = k.Hold(ctx, st.Owner, st.Team); err != nil {
		return nil, err
	}
	ms, err := k.o.Store.Machines().ByStack(ctx, st.ID)
	if err != nil {
		release()
		return nil, err
	}
	planned := make([]api.PlannedMachine, 0, len(ms))
	for _, m := range ms {
		planned = append(planned, api.PlannedMachine{Label: m.Label, Provider: m.Provider, Attributes: m.Attributes})
	}
	if err := k.Check(ctx, st.Owner, st.Team, st.ID, planned); err != nil {
		release()
		return nil, err
	}
	return release, nil
}

// Status is subject's limit, use and what is left.
func (k *Keeper) Status(ctx context.Context, subject string) (api.QuotaStatus, error) {
	limit, _, err := k.Of(ctx, subject)
	if err != nil {
		return api.QuotaStatus{}, err
	}
	use, err := k.use(ctx, subject, "")
	if err != nil {
		return api.QuotaStatus{}, err
	}
	left := func(l, u float64) float64 {
		if l <= 0 {
			return 0
		}
		return max(l-u, 0)
	}
	return api.QuotaStatus{Subject: subject, Limit: limit, Used: use, Left: api.Quota{
		Machines: int64(left(float64(limit.Machines), float64(use.Machines))),
		Cores:    left(limit.Cores, use.Cores),
		MemoryMB: int64(left(float64(limit.MemoryMB), float64(use.MemoryMB))),
		DiskMB:   int64(left(float64(limit.DiskMB), float64(use.DiskMB))),
		Buckets:  int64(left(float64(limit.Buckets), float64(use.Buckets))),
		BucketMB: int64(left(float64(limit.BucketMB), float64(use.BucketMB))),
	}}, nil
}

// CheckBuckets refuses the bucket claims want of owner's stack stackID ("": a new stack) in
// team when they would take owner or team above its bucket quota: more claims, or more MB
// (the sum of their max sizes), than the limit, counting the claims of the owner's (the
// team's) other stacks. The claims the stack holds already are not asked for again: a
// re-apply asks for nothing new, and a stack over a lowered quota may keep what it has. Under
// a limit of MB, a claim without a max size is refused: it would have no bound the S3 server
// enforces.
func (k *Keeper) CheckBuckets(ctx context.Context, owner, team, stackID string, want []model.BucketClaim) error {
	if len(want) == 0 {
		return nil
	}
	need := claimsHeld(want)
	var held api.Quota
	if stackID != "" {
		cs, err := k.o.Store.BucketClaims().ByStack(ctx, stackID)
		if err != nil {
			return err
		}
		held = claimsHeld(cs)
	}
	for _, sub := range Subjects(owner, team) {
		limit, ok, err := k.Of(ctx, sub)
		if err != nil {
			return err
		}
		if !ok || limit.Buckets == 0 && limit.BucketMB == 0 {
			continue
		}
		kind, name, _ := strings.Cut(sub, "/")
		refuse := func(format string, a ...any) error {
			return &kite.Error{Code: kite.CodeTooLarge, Data: &kite.ErrorData{Type: api.QuotaCode},
				Message: "bucket quota: " + fmt.Sprintf(format, a...)}
		}
		remedy := fmt.Sprintf("destroy a stack with buckets first, or an administrator raises it with `kloud quota set --%s %s`", kind, name)
		if limit.BucketMB > 0 {
			for _, c := range want {
				if c.MaxBytes <= 0 {
					return refuse("%s %s may claim %d MB of buckets in all; bucket %q sets no max_size_mb: give it one (or an administrator lifts the limit with `kloud quota set --%s %s`)", kind, name, limit.BucketMB, c.Label, kind, name)
				}
			}
		}
		use, err := k.use(ctx, sub, stackID)
		if err != nil {
			return err
		}
		if limit.Buckets > 0 && use.Buckets+need.Buckets > limit.Buckets && need.Buckets > held.Buckets {
			return refuse("%s %s has %d of %d buckets; this stack asks for %d more (%s)", kind, name, use.Buckets+held.Buckets, limit.Buckets, need.Buckets-held.Buckets, remedy)
		}
		if limit.BucketMB > 0 && use.BucketMB+need.BucketMB > limit.BucketMB && need.BucketMB > held.BucketMB {
			return refuse("%s %s has claimed %d of %d MB of buckets; this stack asks for %d MB more (%s)", kind, name, use.BucketMB+held.BucketMB, limit.BucketMB, need.BucketMB-held.BucketMB, remedy)
		}
	}
	return nil
}
