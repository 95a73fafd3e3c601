package kloud_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/objstore/seaweed/seaweedtest"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/dummy"
)

// bucketsTemplate is a template of one machine and n buckets of max_size_mb mb each (0: none).
func bucketsTemplate(n, mb int) string {
	var b strings.Builder
	b.WriteString("resource \"terraform_data\" \"vm\" {\n  input = \"#!/bin/bash\\necho hello\"\n}\n")
	for i := range n {
		b.WriteString("resource \"kloud_bucket\" \"b" + string(rune('a'+i)) + "\" {\n")
		if mb > 0 {
			b.WriteString("  max_size_mb = " + strconv.Itoa(mb) + "\n")
		}
		b.WriteString("}\n")
	}
	return b.String()
}

// Bucket quotas on the real S3 server (SeaweedFS) and the dummy provider: stack.plan and
// stack.create refuse claims over a user's or a team's quota of buckets or of MB, naming the
// limit, the use and the ask; under a quota of MB a claim without max_size_mb is refused; a
// re-apply of a stack at its quota asks for nothing new; the build stage refuses a stack
// created before the quota was lowered, before it provisions anything; quota.show counts the
// claims, and so do the metrics kloud_quota_used and kloud_quota_limit.
func TestBucketQuota(t *testing.T) {
	t.Parallel()
	srv := seaweedtest.Start(t)
	prov := srv.Provisioner("bucket-quota-" + strings.ToLower(t.Name()))
	f := newFlowProvider(t, dummy.Options{}, kloudtest.Options{}, func(p *provider.Provider) { p.Buckets = prov })
	f.credential()
	c, admin, ctx := f.client(), f.Client(kloud.Admin), t.Context()
	set := func(sub api.QuotaSubject, q api.Quota) {
		t.Helper()
		if _, err := admin.QuotaSet(ctx, api.QuotaSetParams{QuotaSubject: sub, Limit: q}); err != nil {
			t.Fatal(err)
		}
	}
	alice, team := api.QuotaSubject{User: "alice"}, api.QuotaSubject{Team: model.DefaultTeam}
	plan := func(tid string) error {
		_, err := c.StackPlan(ctx, api.StackPlanParams{TemplateID: tid})
		return err
	}
	two, one, unsized := f.template(bucketsTemplate(2, 16)), f.template(bucketsTemplate(1, 16)), f.template(bucketsTemplate(1, 0))

	set(alice, api.Quota{Buckets: 3})
	s1, _ := f.stack(two)
	ref, err := c.StackApply(ctx, api.StackApplyParams{StackID: s1})
	f.jobOK("build of 2 buckets within 3", ref, err)
	s2, _ := f.stack(one) // 3 of 3 once built
	st, err := c.QuotaShow(ctx, api.QuotaShowParams{})
	if err != nil || st.Used.Buckets != 2 || st.Used.BucketMB != 32 || st.Left.Buckets != 1 || st.Limit.Buckets != 3 {
		t.Fatalf("quota.show: %+v %v", st, err)
	}
	kloud.PollMetrics(ctx, f.Server)
	body := metricsOf(t, f.Env)
	for _, w := range []struct {
		name, resource string
		want           float64
	}{{"kloud_quota_used", "buckets", 2}, {"kloud_quota_used", "bucket_bytes", 32 << 20}, {"kloud_quota_limit", "buckets", 3}} {
		if v, ok := metric(body, w.name, map[string]string{"subject": "user/alice", "resource": w.resource}); !ok || v != w.want {
			t.Errorf("%s{user/alice,%s} = %v (found %v), want %v", w.name, w.resource, v, ok, w.want)
		}
	}
	refusedQuota(t, "plan of 2 more", plan(two), "bucket quota: user alice has 2 of 3 buckets; this stack asks for 2 more")
	if _, err := c.StackCreate(ctx, api.StackPlanParams{TemplateID: two}); err == nil {
		t.Fatal("stack.create of 2 more buckets over the quota: no refusal")
	}

	// Lowered to what s1 holds: s1's re-apply asks for nothing new; s2's build is refused in
	// the build stage, before any claim is recorded.
	set(alice, api.Quota{Buckets: 2})
	ref, err = c.StackApply(ctx, api.StackApplyParams{StackID: s1})
	f.jobOK("re-apply at the quota", ref, err)
	ref, err = c.StackApply(ctx, api.StackApplyParams{StackID: s2})
	if err != nil {
		t.Fatal(err)
	}
	if last := f.follow(ref.JobID); last.Status != "failed" || !strings.Contains(last.Error, "bucket quota: user alice has 2 of 2 buckets; this stack asks for 1 more") {
		t.Fatalf("build of s2 over the quota: %+v", last)
	}
	if l, err := c.BucketList(ctx, api.BucketListParams{StackID: s2}); err != nil || len(l.Buckets) != 0 {
		t.Fatalf("claims of the refused build: %+v %v", l, err)
	}

	// A quota of MB: a claim needs a max_size_mb; 32 of 40 MB are claimed.
	set(alice, api.Quota{BucketMB: 40})
	refusedQuota(t, "plan of an unsized claim", plan(unsized), `bucket quota: user alice may claim 40 MB of buckets in all; bucket "ba" sets no max_size_mb`)
	refusedQuota(t, "plan over the MB", plan(one), "bucket quota: user alice has claimed 32 of 40 MB of buckets; this stack asks for 16 MB more")
	set(alice, api.Quota{BucketMB: 48})
	if err := plan(one); err != nil {
		t.Fatalf("plan within the MB: %v", err)
	}

	// The team's quota counts its members' claims too.
	set(team, api.Quota{Buckets: 2})
	refusedQuota(t, "plan over the team's quota", plan(one), "bucket quota: team "+model.DefaultTeam+" has 2 of 2 buckets; this stack asks for 1 more", "--team "+model.DefaultTeam)
	set(team, api.Quota{})

	ref, err = c.StackApply(ctx, api.StackApplyParams{StackID: s1, Destroy: true})
	f.jobOK("destroy s1", ref, err)
	if st, err := c.QuotaShow(ctx, api.QuotaShowParams{}); err != nil || st.Used.Buckets != 0 || st.Used.BucketMB != 0 {
		t.Fatalf("quota.show after the destroy: %+v %v", st, err)
	}
}
