package kloud

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/quota"
	"github.com/kloud-dev/kloud/kloud/snapshots"
	"github.com/kloud-dev/kloud/kloud/stackbuild"
	"github.com/kloud-dev/kloud/kloud/store"
)

// Quotas (issue 19): the computation (what a machine takes, what a subject holds, the checks,
// the quota leases) is package kloud/quota; kloud builds its Keeper here, checks who may see or
// set a subject's quota (quota.set, quota.show) and keeps the names its stack handlers and
// metrics call.

// Quota is an amount of machines, cores, memory (MB), disk (MB), bucket claims and their MB; as
// a limit, 0 is none.
type Quota = api.Quota

// ParseQuota parses kloud serve's --default-quota: comma-separated machines=N, cores=N,
// memory=SIZE, disk=SIZE, buckets=N and bucketBytes=SIZE (SIZE in MB, or with an M, G or T
// suffix: 8G); those not given have no limit.
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
		case "buckets":
			q.Buckets, err = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		case "bucketBytes":
			q.BucketMB, err = ParseMB(v)
		default:
			return q, fmt.Errorf("quota %q: unknown limit %q (want machines, cores, memory, disk, buckets, bucketBytes)", s, k)
		}
		if err != nil || q.Machines < 0 || q.Cores < 0 || q.Buckets < 0 {
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

// quotas is the quota keeper over this server's store and providers.
func (s *Server) quotas() *quota.Keeper { return s.quota }

// newQuotaKeeper builds the keeper New keeps (it holds no state of its own).
func newQuotaKeeper(s *Server) *quota.Keeper {
	return quota.New(quota.Options{Store: s.store, Providers: s.providers, Default: s.opts.DefaultQuota,
		LeaseTTL: stackLeaseTTL, Logger: s.log})
}

// quotaSubjects are the quota documents' ids of owner and team (quota.Subjects).
func quotaSubjects(owner, team string) []string { return quota.Subjects(owner, team) }

// addQuota is a and b together (quota.Add).
func addQuota(a, b api.Quota) api.Quota { return quota.Add(a, b) }

// quotaExceeded is quota.Exceeded: the refusal of need on top of use under limit.
func quotaExceeded(subject string, limit, use, need, held api.Quota) error {
	return quota.Exceeded(subject, limit, use, need, held)
}

// checkQuota refuses planned machines of owner's stack except (""; a new stack) in team that
// would take owner or team above its quota (quota.Keeper.Check).
func (s *Server) checkQuota(ctx context.Context, owner, team, except string, planned []api.PlannedMachine) error {
	return s.quotas().Check(ctx, owner, team, except, planned)
}

// holdQuota takes the quota leases of owner and team until release (quota.Keeper.Hold).
func (s *Server) holdQuota(ctx context.Context, owner, team string) (release func(), err error) {
	return s.quotas().Hold(ctx, owner, team)
}

// checkBucketQuota refuses bucket claims of owner's stack stackID ("": a new stack) in team
// that would take owner or team above its bucket quota (quota.Keeper.CheckBuckets).
func (s *Server) checkBucketQuota(ctx context.Context, owner, team, stackID string, specs []stackbuild.BucketSpec) error {
	return s.quotas().CheckBuckets(ctx, owner, team, stackID, stackbuild.Claims(stackID, specs))
}

// applyQuota is stack.apply's check of a stack that was never built, with the quota leases
// held until release (quota.Keeper.Apply).
func (s *Server) applyQuota(ctx context.Context, st *model.Stack) (release func(), err error) {
	return s.quotas().Apply(ctx, st)
}

// quotaAPI serves quota.set and quota.show: who may see or set which subject's quota, and the
// quota's status from the keeper.
type quotaAPI struct {
	store  *store.Store // teams and users (the subjects), the quotas set
	keeper *quota.Keeper
	log    *slog.Logger
}

// subject checks a quota.set or quota.show subject and names it.
func (q *quotaAPI) subject(ctx context.Context, c *Caller, p api.QuotaSubject) (string, error) {
	switch {
	case p.Team != "" || p.Pool != "":
		team, kind := p.Team, "team/"
		if p.Pool != "" {
			team, kind = p.Pool, "pool/"
		}
		if !c.Admin && !c.InTeam(team) {
			return "", notFound("team", team)
		}
		if _, err := q.store.Teams().Get(ctx, team); err != nil {
			return "", err
		}
		return kind + team, nil
	case p.User != "" && p.User != c.Username:
		if !c.Admin {
			return "", fmt.Errorf("only kloud administrators see another user's quota: %w", kite.ErrPermission)
		}
		ok, err := q.store.Users().Exists(ctx, p.User)
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

// set serves quota.set: a kloud owner sets a user's or a team's limits.
func (q *quotaAPI) set(ctx context.Context, c *Caller, _ *kite.Request, p *api.QuotaSetParams) (api.QuotaStatus, error) {
	sub, err := q.subject(ctx, c, p.QuotaSubject)
	if err != nil {
		return api.QuotaStatus{}, err
	}
	l := p.Limit
	if err := q.store.Quotas().Set(ctx, store.Quota{ID: sub, Machines: l.Machines, Cores: l.Cores, MemoryMB: l.MemoryMB, DiskMB: l.DiskMB,
		Buckets: l.Buckets, BucketMB: l.BucketMB, UpdatedBy: c.Username}); err != nil {
		return api.QuotaStatus{}, err
	}
	q.log.InfoContext(ctx, "quota set", "subject", sub, "by", c.Username, "machines", l.Machines, "cores", l.Cores, "memoryMB", l.MemoryMB, "diskMB", l.DiskMB,
		"buckets", l.Buckets, "bucketMB", l.BucketMB)
	return q.keeper.Status(ctx, sub)
}

// show serves quota.show: a subject's limits and use (the user itself, its team's members,
// kloud admins).
func (q *quotaAPI) show(ctx context.Context, c *Caller, _ *kite.Request, p *api.QuotaShowParams) (api.QuotaStatus, error) {
	sub, err := q.subject(ctx, c, p.QuotaSubject)
	if err != nil {
		return api.QuotaStatus{}, err
	}
	return q.keeper.Status(ctx, sub)
}
