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
	"github.com/kloud-dev/kloud/kloud/snapshots"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/provider"
)

// Quotas (issue 19): per user and per team limits on machines, cores, memory (MB) and disk (MB),
// set by kloud administrators (quota.set; kloud/store Quotas, one document per subject; none:
// no limit). The use of a subject is what its stacks that are built or being built hold (every
// stack but NotInitialized ones; a stack's machines but Terminated ones): a machine's cores,
// memory and disk are its planned attributes as its provider's constraints vocabulary names
// them (provider.ConstraintCores, Mem, Disk; without a vocabulary: cpus or cores, memory,
// disk_mb). stack.plan and stack.create check that the planned machines fit; stack.apply,
// stack.update and stack.scale check it and hold the owner's (and team's) quota lease until the
// stack is Building, so the check and the reservation are one step: concurrent applies of one
// user never build more than the quota. A refusal is -32008 (too large, data type
// api.QuotaCode) naming the limit, the use and the request, before any job or change.

// Quota is an amount of machines, cores, memory (MB) and disk (MB); as a limit, 0 is none.
type Quota = api.Quota

// ParseQuota parses kloud serve's --default-quota: comma-separated machines=N, cores=N,
// memory=SIZE and disk=SIZE (SIZE in MB, or with an M, G or T suffix: 8G); those not given have
// no limit.
func ParseQuota(s string) (api.Quota, error) {
	var q api.Quota
	for part := range strings.SplitSeq(s, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
		var err error
		switch k = strings.TrimSpace(k); k {
		case "":
			continue
		case "machines":
			q.Machines, err = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		case "cores":
			q.Cores, err = strconv.ParseFloat(strings.TrimSpace(v), 64)
		case "memory":
			q.MemoryMB, err = ParseMB(v)
		case "disk":
			q.DiskMB, err = ParseMB(v)
		default:
			return q, fmt.Errorf("quota %q: unknown limit %q (want machines, cores, memory, disk)", s, k)
		}
		if err != nil || q.Machines < 0 || q.Cores < 0 {
			return q, fmt.Errorf("quota %q: %s=%q is not a number of 0 or more (sizes: 512, 8G)", s, k, v)
		}
	}
	return q, nil
}

// ParseMB reads a size in MB: a number with an optional M, G or T suffix (powers of 1024; an
// optional "B" or "iB" after it), or "unlimited" (0).
func ParseMB(s string) (int64, error) {
	if strings.EqualFold(strings.TrimSpace(s), "unlimited") {
		return 0, nil
	}
	n, ok := snapshots.ParseScaled(s, map[byte]int64{'M': 1, 'G': 1 << 10, 'T': 1 << 20})
	if !ok {
		return 0, fmt.Errorf("size %q: want MB or a number with M, G or T (8G), or \"unlimited\"", s)
	}
	return n, nil
}

// quotaSubjects are the quota documents' ids of owner and team.
func quotaSubjects(owner, team string) []string {
	return []string{"user/" + owner, "team/" + team}
}

// machineNeed is what one machine of provider name with planned attributes takes of a quota.
func (s *Server) machineNeed(name string, attrs map[string]any) api.Quota {
	attr := map[string][]string{
		provider.ConstraintCores: {"cpus", "cores"},
		provider.ConstraintMem:   {"memory"},
		provider.ConstraintDisk:  {"disk_mb"},
	}
	if p, err := s.providers.Lookup(name); err == nil && p.Constraints != nil {
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

func addQuota(a, b api.Quota) api.Quota {
	return api.Quota{Machines: a.Machines + b.Machines, Cores: a.Cores + b.Cores, MemoryMB: a.MemoryMB + b.MemoryMB, DiskMB: a.DiskMB + b.DiskMB}
}

// plannedNeed is what planned machines take.
func (s *Server) plannedNeed(ms []api.PlannedMachine) api.Quota {
	var n api.Quota
	for _, m := range ms {
		n = addQuota(n, s.machineNeed(m.Provider, m.Attributes))
	}
	return n
}

// quotaUse is what subject's stacks hold (built or being built), but stack except's.
func (s *Server) quotaUse(ctx context.Context, subject, except string) (api.Quota, error) {
	var f store.StackFilter
	switch kind, name, _ := strings.Cut(subject, "/"); kind {
	case "user":
		f.Owner = name
	default:
		f.Team = name
	}
	sts, err := s.store.Stacks().List(ctx, f)
	if err != nil {
		return api.Quota{}, fmt.Errorf("quota use of %s: %w", subject, err)
	}
	var use api.Quota
	for _, st := range sts {
		if st.ID == except {
			continue
		}
		held, err := s.stackHeld(ctx, &st)
		if err != nil {
			return api.Quota{}, fmt.Errorf("quota use of %s: %w", subject, err)
		}
		use = addQuota(use, held)
	}
	return use, nil
}

// stackHeld is what stack st holds of its owner's and team's quotas: nothing before it was
// built, else its machines but terminated ones.
func (s *Server) stackHeld(ctx context.Context, st *Stack) (api.Quota, error) {
	if st.State == StackNotInitialized {
		return api.Quota{}, nil
	}
	ms, err := s.stackMachines(ctx, st.ID)
	if err != nil {
		return api.Quota{}, err
	}
	return s.machinesHeld(st, ms), nil // metrics.go
}

// quotaOf returns subject's quota (ok false: no limit): the one an administrator set, else for
// a user the default quota (Options.DefaultQuota). A quota set with every limit 0 is no limit,
// also when there is a default.
func (s *Server) quotaOf(ctx context.Context, subject string) (q api.Quota, ok bool, err error) {
	d, err := s.store.Quotas().Get(ctx, subject)
	if errors.Is(err, store.ErrNotFound) {
		if strings.HasPrefix(subject, "user/") {
			return s.opts.DefaultQuota, s.opts.DefaultQuota != (api.Quota{}), nil
		}
		return api.Quota{}, false, nil
	}
	if err != nil {
		return api.Quota{}, false, err
	}
	q = api.Quota{Machines: d.Machines, Cores: d.Cores, MemoryMB: d.MemoryMB, DiskMB: d.DiskMB}
	return q, q != (api.Quota{}), nil
}

// checkQuota refuses planned machines of owner's stack except (""; a new stack) in team that
// would take owner or team above its quota. What the stack holds already is never refused (a
// stack over a lowered quota may scale down or be rebuilt).
func (s *Server) checkQuota(ctx context.Context, owner, team, except string, planned []api.PlannedMachine) error {
	need := s.plannedNeed(planned)
	var held api.Quota
	if except != "" {
		st, err := s.store.Stacks().Get(ctx, except)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		if err == nil {
			if held, err = s.stackHeld(ctx, &st); err != nil {
				return err
			}
		}
	}
	for _, sub := range quotaSubjects(owner, team) {
		limit, ok, err := s.quotaOf(ctx, sub)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		use, err := s.quotaUse(ctx, sub, except)
		if err != nil {
			return err
		}
		if err := quotaExceeded(sub, limit, use, need, held); err != nil {
			return err
		}
	}
	return nil
}

// quotaExceeded is the refusal of need on top of use under limit (nil: it fits); a resource
// whose need is no more than what the stack holds already (held) is not refused.
func quotaExceeded(subject string, limit, use, need, held api.Quota) error {
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

// quotaLeaseWait bounds how long a call waits for another call of the same subject that holds
// its quota lease (a plan of an update may take that long).
const quotaLeaseWait = 2 * time.Minute

// holdQuota takes the quota leases of owner and team, for the subjects that have a quota, so that
// no other apply, update or scale of theirs checks its quota until release (called once the
// stack is Building, when quotaUse counts it).
func (s *Server) holdQuota(ctx context.Context, owner, team string) (release func(), err error) {
	var leases []*store.Lease
	release = func() {
		for _, l := range leases {
			if err := s.store.Persist(ctx, "release lease "+l.Name, 30*time.Second, l.Release); err != nil {
				s.log.WarnContext(ctx, "release quota lease (it lapses by itself)", "lease", l.Name, "err", err)
			}
		}
	}
	id := "quota-" + store.NewID()
	for _, sub := range quotaSubjects(owner, team) {
		if _, ok, err := s.quotaOf(ctx, sub); err != nil || !ok {
			if err != nil {
				release()
				return nil, err
			}
			continue
		}
		deadline := time.Now().Add(quotaLeaseWait)
		for {
			l, err := s.store.AcquireLease(ctx, "quota/"+sub, id, stackLeaseTTL)
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

// applyQuota is stack.apply's check of a stack that was never built: its recorded machines
// under owner's and team's quotas, with the quota leases held until release.
func (s *Server) applyQuota(ctx context.Context, st *Stack) (release func(), err error) {
	if release, err = s.holdQuota(ctx, st.Owner, st.Team); err != nil {
		return nil, err
	}
	ms, err := s.stackMachines(ctx, st.ID)
	if err != nil {
		release()
		return nil, err
	}
	planned := make([]api.PlannedMachine, 0, len(ms))
	for _, m := range ms {
		planned = append(planned, api.PlannedMachine{Label: m.Label, Provider: m.Provider, Attributes: m.Attributes})
	}
	if err := s.checkQuota(ctx, st.Owner, st.Team, st.ID, planned); err != nil {
		release()
		return nil, err
	}
	return release, nil
}

// quotaSubject checks a quota.set or quota.show subject and names it.
func (s *Server) quotaSubject(ctx context.Context, c *Caller, p api.QuotaSubject) (string, error) {
	switch {
	case p.Team != "":
		if !c.Admin && !c.InTeam(p.Team) {
			return "", notFound("team", p.Team)
		}
		if _, err := s.store.Teams().Get(ctx, p.Team); err != nil {
			return "", err
		}
		return "team/" + p.Team, nil
	case p.User != "" && p.User != c.Username:
		if !c.Admin {
			return "", fmt.Errorf("only kloud administrators see another user's quota: %w", kite.ErrPermission)
		}
		ok, err := s.store.Users().Exists(ctx, p.User)
		if err != nil {
			return "", err
		}
		if !ok {
			return "", notFound("user", p.User)
		}
		return "user/" + p.User, nil
	}
	return "user/" + c.Username, nil
}

func (s *Server) quotaStatus(ctx context.Context, subject string) (api.QuotaStatus, error) {
	limit, _, err := s.quotaOf(ctx, subject)
	if err != nil {
		return api.QuotaStatus{}, err
	}
	use, err := s.quotaUse(ctx, subject, "")
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
	}}, nil
}

func (s *Server) quotaSet(ctx context.Context, c *Caller, _ *kite.Request, p *api.QuotaSetParams) (api.QuotaStatus, error) {
	sub, err := s.quotaSubject(ctx, c, p.QuotaSubject)
	if err != nil {
		return api.QuotaStatus{}, err
	}
	l := p.Limit
	if err := s.store.Quotas().Set(ctx, store.Quota{ID: sub, Machines: l.Machines, Cores: l.Cores, MemoryMB: l.MemoryMB, DiskMB: l.DiskMB, UpdatedBy: c.Username}); err != nil {
		return api.QuotaStatus{}, err
	}
	s.log.InfoContext(ctx, "quota set", "subject", sub, "by", c.Username, "machines", l.Machines, "cores", l.Cores, "memoryMB", l.MemoryMB, "diskMB", l.DiskMB)
	return s.quotaStatus(ctx, sub)
}

func (s *Server) quotaShow(ctx context.Context, c *Caller, _ *kite.Request, p *api.QuotaShowParams) (api.QuotaStatus, error) {
	sub, err := s.quotaSubject(ctx, c, p.QuotaSubject)
	if err != nil {
		return api.QuotaStatus{}, err
	}
	return s.quotaStatus(ctx, sub)
}
