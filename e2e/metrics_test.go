package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
)

// prometheus is a real Prometheus (Debian's package) this test started, scraping targets.
type prometheus struct {
	t    *testing.T
	addr string
	cmd  *exec.Cmd
	out  *testutil.SyncBuffer
}

// startPrometheus runs /usr/bin/prometheus with a config of its own that scrapes each job's
// target every second, its storage in a temp dir, on a free loopback port; it is stopped (by
// pid) when the test ends.
func startPrometheus(t *testing.T, jobs map[string]string) *prometheus {
	t.Helper()
	bin := testutil.RequireBinary(t, "prometheus")
	dir := t.TempDir()
	var cfg strings.Builder
	cfg.WriteString("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\nscrape_configs:\n")
	for job, target := range jobs {
		fmt.Fprintf(&cfg, "  - job_name: %s\n    static_configs:\n      - targets: [%q]\n", job, target)
	}
	cfgFile := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgFile, []byte(cfg.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	p := &prometheus{t: t, addr: testutil.FreeLoopback(t), out: &testutil.SyncBuffer{}}
	p.cmd = exec.Command(bin, "--config.file="+cfgFile, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+p.addr, "--log.level=warn")
	p.cmd.Dir = dir
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { p.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			p.cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("prometheus output:\n%s", p.out)
		}
	})
	testutil.Eventually(t, 60*time.Second, func() bool {
		r, err := http.Get("http://" + p.addr + "/-/ready")
		if err != nil {
			return false
		}
		r.Body.Close()
		return r.StatusCode == http.StatusOK
	}, "prometheus did not get ready:\n%s", p.out)
	return p
}

// query asks Prometheus' HTTP API for the instant vector of q and returns its samples' sum
// (ok false: an empty result).
func (p *prometheus) query(q string) (float64, bool, error) {
	r, err := http.Get("http://" + p.addr + "/api/v1/query?query=" + url.QueryEscape(q))
	if err != nil {
		return 0, false, err
	}
	defer r.Body.Close()
	var res struct {
		Status string
		Error  string
		Data   struct {
			Result []struct {
				Metric map[string]string
				Value  [2]any
			}
		}
	}
	if err := json.NewDecoder(r.Body).Decode(&res); err != nil {
		return 0, false, err
	}
	if res.Status != "success" {
		return 0, false, fmt.Errorf("query %s: %s", q, res.Error)
	}
	var sum float64
	for _, s := range res.Data.Result {
		str, _ := s.Value[1].(string)
		v, err := strconv.ParseFloat(str, 64)
		if err != nil {
			return 0, false, fmt.Errorf("query %s: value %v", q, s.Value)
		}
		sum += v
	}
	return sum, len(res.Data.Result) > 0, nil
}

// waitFor waits until q's value is within [min, max].
func (p *prometheus) waitFor(q string, min, max float64) {
	p.t.Helper()
	var last string
	ok := false
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		v, found, err := p.query(q)
		last = fmt.Sprintf("%v (found %v, err %v)", v, found, err)
		if err == nil && found && v >= min && v <= max {
			ok = true
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if !ok {
		p.t.Fatalf("prometheus: %s = %s, want %v..%v", q, last, min, max)
	}
}

// TestPrometheusScrapesKloud: a real Prometheus scrapes kloud's --metrics-addr and the
// terraformer's (kloud serve --terraformer-metrics-addr) every second while alice builds a stack
// of two dummy machines (real klient processes, real terraform); its HTTP API then has the calls,
// the job and its duration, the agents, the planner's waits, the machines' figures, the quota use
// and terraform's runs, and saw the job running and agents being waited for while it built.
func TestPrometheusScrapesKloud(t *testing.T) {
	parallel(t)
	maddr, tfaddr := testutil.FreeLoopback(t), testutil.FreeLoopback(t)
	e := newEnv(t, "--metrics-addr", maddr, "--metrics-interval", "1s", "--terraformer-metrics-addr", tfaddr)
	if !strings.Contains(e.kloudOut.String(), "metrics: http://"+maddr+"/metrics") {
		t.Fatalf("kloud serve does not say where its metrics are:\n%s", e.kloudOut)
	}
	p := startPrometheus(t, map[string]string{"kloud": maddr, "terraformer": tfaddr})
	p.waitFor(`up{job="kloud"}`, 1, 1)
	p.waitFor(`up{job="terraformer"}`, 1, 1)

	// On kloud's own address the metrics are for administrators.
	if r, err := http.Get(e.url() + "/metrics"); err != nil || r.StatusCode != http.StatusUnauthorized {
		t.Fatalf("GET /metrics on kloud's address without a credential: %v %v", r, err)
	}

	e.alice()
	aliceKey := e.key
	e.key = ""
	e.run("quota", "set", "--user", "alice", "--machines", "5")
	e.key = aliceKey
	tid := e.template(`
resource "terraform_data" "vm" {
  count = 2
  input = "#!/bin/bash\necho provisioning; sleep 4; echo provisioned"
}
`)
	sid := e.createStack(tid)
	e.apply(sid)

	p.waitFor(`kloud_rpc_calls_total{method="stack.apply",code="0"}`, 1, 1e9)
	p.waitFor(`kloud_jobs_finished_total{kind="stack.apply",state="succeeded"}`, 1, 1)
	p.waitFor(`kloud_job_duration_seconds_count{kind="stack.apply",state="succeeded"}`, 1, 1)
	p.waitFor(`kloud_job_duration_seconds_sum{kind="stack.apply",state="succeeded"}`, 4, 600)
	p.waitFor(`kloud_kontrol_registered_kites{kind="agent"}`, 2, 2)
	p.waitFor(`kloud_planner_wait_seconds_count{result="ok"}`, 2, 2)
	p.waitFor(`count(kloud_machine_memory_total_bytes{owner="alice"} > 0)`, 2, 2)
	p.waitFor(`count(kloud_machine_cpus{owner="alice"} >= 1)`, 2, 2)
	p.waitFor(`kloud_quota_used{subject="user/alice",resource="machines"}`, 2, 2)
	p.waitFor(`kloud_quota_limit{subject="user/alice",resource="machines"}`, 5, 5)
	p.waitFor(`sum(kloud_store_command_duration_seconds_count)`, 1, 1e12)
	p.waitFor(`terraformer_operation_duration_seconds_count{op="apply",status="succeeded"}`, 1, 1)
	p.waitFor(`terraformer_rpc_calls_total{method="terraformer.apply",code="0"}`, 1, 1e9)
	// Scraped during the build: the job was running and the agents were being waited for.
	p.waitFor(`max_over_time(kloud_jobs_running{kind="stack.apply"}[10m])`, 1, 1)
	p.waitFor(`max_over_time(kloud_planner_waiting_agents[10m])`, 1, 2)

	// Every ready query of docs/operations.md is one Prometheus accepts, and the quota share
	// query answers alice's 2 of 5.
	for _, q := range docQueries(t) {
		if _, _, err := p.query(q); err != nil {
			t.Errorf("docs/operations.md query: %v", err)
		}
	}
	p.waitFor(`kloud_quota_used{subject="user/alice",resource="machines"} / (kloud_quota_limit > 0)`, 0.4, 0.4)

	e.run("stack", "destroy", sid)
	p.waitFor(`kloud_kontrol_registered_kites{kind="agent"}`, 0, 0)
	p.waitFor(`kloud_quota_used{subject="user/alice",resource="machines"}`, 0, 0)
	p.waitFor(`absent(kloud_machine_memory_total_bytes{owner="alice"})`, 1, 1)
}

// docQueries returns the PromQL of docs/operations.md's "Ready queries" table.
func docQueries(t *testing.T) []string {
	t.Helper()
	root, err := testutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, after, _ := strings.Cut(string(b), "**Ready queries.**")
	table, _, _ := strings.Cut(after, "**What the tests verify.**")
	var qs []string
	for line := range strings.SplitSeq(table, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 {
			continue
		}
		q := strings.TrimSpace(cells[2])
		if strings.HasPrefix(q, "`") && strings.HasSuffix(q, "`") {
			qs = append(qs, strings.Trim(q, "`"))
		}
	}
	if len(qs) < 10 {
		t.Fatalf("docs/operations.md: %d ready queries found", len(qs))
	}
	return qs
}
