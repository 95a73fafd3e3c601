package kloud_test

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/providers/dummy"
	"github.com/kloud-dev/kloud/terraformer/tfrun"
)

// TestPlanJob: stack.planJob answers with a job at once; the job (kind stack.plan, target the
// template) ends with stack.plan's own answer as its result, terraform's lines in its log and
// 100%; a refusal that needs terraform's plan (the quota) fails the job with the quota's message;
// the 100,000-machine request is refused at the call, with no job and no terraform.
func TestPlanJob(t *testing.T) {
	t.Parallel()
	f := newFlowWith(t, dummy.Options{}, kloudtest.Options{})
	f.credential()
	ctx := t.Context()
	c := f.client()
	tid := f.template(twoVMs)

	want, err := c.StackPlan(ctx, api.StackPlanParams{TemplateID: tid})
	if err != nil {
		t.Fatal(err)
	}
	ref, err := c.StackPlanJob(ctx, api.StackPlanParams{TemplateID: tid})
	if err != nil || ref.JobID == "" {
		t.Fatalf("stack.planJob: %+v %v", ref, err)
	}
	last := f.follow(ref.JobID)
	if last.Status != api.JobSucceeded || last.Percentage != 100 {
		t.Fatalf("plan job ended %s at %d%%: %s", last.Status, last.Percentage, last.Error)
	}
	got, err := api.PlanJobResult(last.Result)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("plan job result:\n%+v\nstack.plan:\n%+v", got, want)
	}
	if len(got.Machines) != 2 {
		t.Errorf("plan job planned %d machines, want 2", len(got.Machines))
	}
	j, err := c.JobGet(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	if j.Kind != "stack.plan" || j.Target != "template/"+tid || j.Owner != "alice" {
		t.Errorf("job %s: kind %s target %s owner %s", j.ID, j.Kind, j.Target, j.Owner)
	}
	if !slices.ContainsFunc(j.Log, func(l string) bool { return strings.Contains(l, "terraform_data.vm[1]") }) {
		t.Errorf("the job's log has no line of terraform's plan: %q", j.Log)
	}

	// The quota is checked on terraform's plan: in the job.
	if _, err := f.Client(kloud.Admin).QuotaSet(ctx, api.QuotaSetParams{QuotaSubject: api.QuotaSubject{User: "alice"}, Limit: api.Quota{Machines: 1}}); err != nil {
		t.Fatal(err)
	}
	ref, err = c.StackPlanJob(ctx, api.StackPlanParams{TemplateID: tid})
	if err != nil {
		t.Fatal(err)
	}
	if last := f.follow(ref.JobID); last.Status != api.JobFailed || !strings.Contains(last.Error, "quota of user alice exceeded: machines: the limit is 1, 0 in use, this asks for 2") {
		t.Errorf("plan job over the quota: %s %q", last.Status, last.Error)
	}

	// The cap is checked before terraform: at the call.
	small := f.template(countOfN) // limits_test.go
	before := len(tfJobs(t, f.tfDir))
	ref, err = c.StackPlanJob(ctx, api.StackPlanParams{TemplateID: small, Variables: map[string]string{"n": "100000"}})
	refusedCap(t, "stack.planJob with n=100000", err, "asks for 100000 machines", "the limit is 20")
	if ref.JobID != "" {
		t.Errorf("refused stack.planJob started job %s", ref.JobID)
	}
	if jobs, err := c.JobList(ctx, api.JobListParams{Target: "template/" + small}); err != nil || len(jobs.Jobs) != 0 {
		t.Errorf("jobs of the refused plan: %+v %v", jobs, err)
	}
	if n := len(tfJobs(t, f.tfDir)); n != before {
		t.Errorf("terraform ran for the refused plan: %d terraformer jobs, %d before", n, before)
	}
	assertNoTerraform(t, f.tfDir)
}

// TestPlanJobCancel: job.cancel of a plan job whose terraform plans 100,000 machines (a count
// only terraform knows) ends the job cancelled and terraform with it: no terraformer job runs,
// no process is left under terraformer's directory.
func TestPlanJobCancel(t *testing.T) {
	t.Parallel()
	f := newFlowWith(t, dummy.Options{}, kloudtest.Options{})
	f.credential()
	ctx := t.Context()
	c := f.client()
	big := f.template(`
resource "terraform_data" "vm" {
  count = max(100000, 1)
}
`)
	ref, err := c.StackPlanJob(ctx, api.StackPlanParams{TemplateID: big})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Minute, func() bool {
		for _, j := range tfJobs(t, f.tfDir) {
			if j.Status == tfrun.StatusRunning {
				return true
			}
		}
		return false
	}, "terraform never started planning")
	if _, err := c.JobCancel(ctx, ref); err != nil {
		t.Fatal(err)
	}
	last := f.follow(ref.JobID)
	if last.Status != api.JobCancelled && last.Status != api.JobFailed {
		t.Fatalf("cancelled plan job: %s", last.Status)
	}
	t.Logf("cancelled plan job: %s %q", last.Status, last.Error)
	assertNoTerraform(t, f.tfDir)
	for _, j := range tfJobs(t, f.tfDir) {
		if j.Status != tfrun.StatusCancelled {
			t.Errorf("terraformer job %s: %s, want cancelled", j.ID, j.Status)
		}
	}
}

// TestPlanJobsPerUserCapped: a user who starts plan jobs without end (each of a 100,000-machine
// plan) gets kloud.MaxPlanJobsPerUser of them running (one terraform, the others waiting for the
// plan of the same template) and the next refused with -32004 saying how to cancel; another user
// still plans; once one of hers ends she may start another. Nothing is left running.
func TestPlanJobsPerUserCapped(t *testing.T) {
	t.Parallel()
	f := newFlowWith(t, dummy.Options{}, kloudtest.Options{})
	f.credential()
	ctx := t.Context()
	c := f.client()
	big := f.template(`
resource "terraform_data" "vm" {
  count = max(100000, 1)
}
`)
	var refs []api.JobRef
	for i := range kloud.MaxPlanJobsPerUser {
		ref, err := c.StackPlanJob(ctx, api.StackPlanParams{TemplateID: big})
		if err != nil {
			t.Fatalf("plan job %d of %d: %v", i+1, kloud.MaxPlanJobsPerUser, err)
		}
		refs = append(refs, ref)
	}
	t.Cleanup(func() {
		for _, ref := range refs {
			c.JobCancel(context.Background(), ref)
		}
	})
	_, err := c.StackPlanJob(ctx, api.StackPlanParams{TemplateID: big})
	if !errors.Is(err, kite.ErrConflict) || !strings.Contains(err.Error(), "kloud job cancel") {
		t.Fatalf("plan job %d: %v, want -32004 naming kloud job cancel", kloud.MaxPlanJobsPerUser+1, err)
	}
	t.Logf("refused: %v", err)

	// bob plans meanwhile.
	admin := f.Client(kloud.Admin)
	if _, err := admin.UserAdd(ctx, api.UserAddParams{Username: "bob", Team: model.DefaultTeam}); err != nil {
		t.Fatal(err)
	}
	small := f.template(countOfN) // limits_test.go
	bob := api.NewClient(f.Dial("bob"))
	ref, err := bob.StackPlanJob(ctx, api.StackPlanParams{TemplateID: small})
	if err != nil {
		t.Fatalf("bob's plan job while alice is at her cap: %v", err)
	}
	var bobs api.Job
	testutil.Eventually(t, time.Minute, func() bool {
		bobs, err = bob.JobGet(ctx, ref)
		return err == nil && bobs.Status.Done()
	}, "bob's plan job did not end: %+v %v", bobs, err)
	if bobs.Status != api.JobSucceeded {
		t.Fatalf("bob's plan job: %s %s", bobs.Status, bobs.Error)
	}

	// One of hers ends: she may start another.
	if _, err := c.JobCancel(ctx, refs[0]); err != nil {
		t.Fatal(err)
	}
	if last := f.follow(refs[0].JobID); !last.Status.Done() {
		t.Fatalf("cancelled plan job: %s", last.Status)
	}
	ref, err = c.StackPlanJob(ctx, api.StackPlanParams{TemplateID: small})
	if err != nil {
		t.Fatalf("a plan job after one of hers ended: %v", err)
	}
	refs = append(refs[1:], ref)
	for _, ref := range refs {
		if _, err := c.JobCancel(ctx, ref); err != nil && !errors.Is(err, kite.ErrState) { // ErrState: it has ended
			t.Fatal(err)
		}
		f.follow(ref.JobID)
	}
	assertNoTerraform(t, f.tfDir)
}
