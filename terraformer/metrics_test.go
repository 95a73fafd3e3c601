package terraformer_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/terraformer"
	"github.com/kloud-dev/kloud/terraformer/terraformertest"
	"github.com/kloud-dev/kloud/terraformer/tfrun"
)

// TestMetrics runs the real terraformer binary with --metrics-addr: on its address /metrics
// needs kloud's (or the admin's) kite key (none: 401, another user's: 403); on the metrics
// address anyone gets it; a succeeded plan and a failed apply move the run histogram and the
// failures counter, and the calls are counted by method and code.
func TestMetrics(t *testing.T) {
	keys := terraformertest.StartKeys(t)
	maddr := testutil.FreeLoopback(t)
	p := startProcArgs(t, keys, "--metrics-addr", maddr)
	if code, body := testutil.HTTPGet(t, p.url()+"/metrics", ""); code != http.StatusUnauthorized || strings.Contains(body, "terraformer_") {
		t.Fatalf("no credential: %d %s", code, body)
	}
	if code, body := testutil.HTTPGet(t, p.url()+"/metrics", keys.KiteKey("alice")); code != http.StatusForbidden {
		t.Fatalf("alice's key: %d %s", code, body)
	}
	for _, user := range []string{"kloud", "admin"} {
		if code, body := testutil.HTTPGet(t, p.url()+"/metrics", keys.KiteKey(user)); code != http.StatusOK || !strings.Contains(body, "terraformer_operations_running 0") {
			t.Fatalf("%s's key: %d %s", user, code, body)
		}
	}

	c := terraformertest.NewClient(t, p.url(), keys.KiteKeyAuth("kloud"))
	run(t, c, tfrun.OpPlan, terraformer.Request{ContentID: "metrics", Files: files(`resource "terraform_data" "x" { input = "a" }`)}, tfrun.StatusSucceeded)
	run(t, c, tfrun.OpApply, terraformer.Request{ContentID: "broken", Files: files(`resource "terraform_data" "x" { input = nosuch.thing }`)}, tfrun.StatusFailed)

	var body string
	testutil.Eventually(t, 10*time.Second, func() bool {
		var code int
		code, body = testutil.HTTPGet(t, "http://"+maddr+"/metrics", "")
		return code == http.StatusOK
	}, "--metrics-addr does not serve")
	for _, want := range []string{
		`terraformer_operation_duration_seconds_count{op="plan",status="succeeded"} 1`,
		`terraformer_operation_duration_seconds_count{op="apply",status="failed"} 1`,
		`terraformer_operation_failures_total{kind="terraform",op="apply"} 1`,
		`terraformer_rpc_calls_total{code="0",method="terraformer.plan"} 1`,
		`terraformer_kite_connections{auth="kiteKey"} 1`,
	} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("no %s", want)
		}
	}
	if strings.Contains(body, `op="plan",status="failed"`) {
		t.Error("the plan counted as failed")
	}
	if t.Failed() {
		t.Logf("metrics:\n%s", body)
	}
}
