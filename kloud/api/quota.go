package api

import (
	"context"
	"errors"
)

// Quotas (issue 19): an administrator's limits on what one user or one team holds across its
// stacks that are built or being built: machines, cores, memory (MB) and disk (MB); and the
// bucket claims its stacks hold and the MB they claim (the sum of their max_size_mb;
// docs/buckets.md "Quotas"). No quota is set by default (no limit).

// Quota methods.
const (
	MethodQuotaSet  = "quota.set"  // kloud administrators
	MethodQuotaShow = "quota.show" // the user itself, a team's members, kloud administrators
)

// QuotaCode is the data type of a quota refusal (code -32008, too large).
const QuotaCode = "quotaExceeded"

// Quota is an amount of each resource a quota counts; as a limit, 0 means no limit.
type Quota struct {
	Machines int64   `json:"machines"`
	Cores    float64 `json:"cores"`
	MemoryMB int64   `json:"memoryMB"`
	DiskMB   int64   `json:"diskMB"`
	Buckets  int64   `json:"buckets"`  // bucket claims
	BucketMB int64   `json:"bucketMB"` // the sum of the bucket claims' max_size_mb
}

// QuotaSubject names a user, a team, or a team's pools (exactly one). A team's pool quota
// limits what the prebuilt stacks of its pools that no user claimed yet hold (pool.set); they
// count against no user's quota and not against the team's.
type QuotaSubject struct {
	User string `json:"user,omitempty"`
	Team string `json:"team,omitempty"`
	Pool string `json:"pool,omitempty"` // a team's slug: the quota of that team's pools
}

// count is how many of User, Team and Pool are given.
func (p QuotaSubject) count() int {
	n := 0
	for _, v := range []string{p.User, p.Team, p.Pool} {
		if v != "" {
			n++
		}
	}
	return n
}

// QuotaSetParams are the params of quota.set: the subject's whole quota (fields left 0 have no
// limit; all 0 removes the quota).
type QuotaSetParams struct {
	QuotaSubject
	Limit Quota `json:"limit"`
}

// Validate implements kite.Validator.
func (p *QuotaSetParams) Validate() error {
	if p.count() != 1 {
		return errors.New("give exactly one of user, team and pool")
	}
	if l := p.Limit; l.Machines < 0 || l.Cores < 0 || l.MemoryMB < 0 || l.DiskMB < 0 || l.Buckets < 0 || l.BucketMB < 0 {
		return errors.New("a quota's limits are 0 (no limit) or more")
	}
	return nil
}

// QuotaShowParams are the params of quota.show: a user or a team (neither: the caller).
type QuotaShowParams struct {
	QuotaSubject
}

// Validate implements kite.Validator.
func (p *QuotaShowParams) Validate() error {
	if p.count() > 1 {
		return errors.New("give one of user, team and pool")
	}
	return nil
}

// QuotaStatus is quota.show's result: the limit, what the subject's built (or building)
// stacks use, and what is left of each limited resource (Left's field is 0 where Limit's is 0).
type QuotaStatus struct {
	Subject string `json:"subject"` // "user/NAME" or "team/SLUG"
	Limit   Quota  `json:"limit"`
	Used    Quota  `json:"used"`
	Left    Quota  `json:"left"`
}

// QuotaSet sets a user's or a team's quota (kloud administrators).
func (c *Client) QuotaSet(ctx context.Context, p QuotaSetParams) (QuotaStatus, error) {
	return RPCQuotaSet.Call(ctx, c.c, p)
}

// QuotaShow shows a user's or a team's quota and use.
func (c *Client) QuotaShow(ctx context.Context, p QuotaShowParams) (QuotaStatus, error) {
	return RPCQuotaShow.Call(ctx, c.c, p)
}
