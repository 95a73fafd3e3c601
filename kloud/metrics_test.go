package kloud_test

import (
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/model"
)

var seriesRe = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$`)
var labelRe = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)

// metric sums the samples of name whose labels include want in a text exposition, and says
// whether there was one.
func metric(body, name string, want map[string]string) (float64, bool) {
	var sum float64
	found := false
	for line := range strings.SplitSeq(body, "\n") {
		m := seriesRe.FindStringSubmatch(line)
		if m == nil || m[1] != name {
			continue
		}
		labels := map[string]string{}
		for _, l := range labelRe.FindAllStringSubmatch(m[2], -1) {
			labels[l[1]] = l[2]
		}
		ok := true
		for k, v := range want {
			ok = ok && labels[k] == v
		}
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(m[3], 64)
		if err != nil {
			continue
		}
		sum, found = sum+v, true
	}
	return sum, found
}

// metricsOf scrapes kloud's /metrics as the administrator.
func metricsOf(t *testing.T, e *kloudtest.Env) string {
	t.Helper()
	key, _, err := e.Server.Kontrol.CreateKey(kloud.Admin, "")
	if err != nil {
		t.Fatal(err)
	}
	code, body := testutil.HTTPGet(t, e.URL+"/metrics", key)
	if code != http.StatusOK {
		t.Fatalf("GET /metrics as admin: %d %s", code, body)
	}
	return body
}

// TestMetricsCountCallsAndRejectedHandshakes: each served call moves its method and code's
// counter by one (an unknown method's name never becomes a label), and each refused handshake
// its reason's counter; the store's commands are timed.
func TestMetricsCountCallsAndRejectedHandshakes(t *testing.T) {
	t.Parallel()
	e := kloudtest.Start(t, kloudtest.Options{})
	ctx := t.Context()
	calls := func(method, code string) float64 {
		v, _ := metric(metricsOf(t, e), "kloud_rpc_calls_total", map[string]string{"method": method, "code": code})
		return v
	}
	rejects := func(reason string) float64 {
		v, ok := metric(metricsOf(t, e), "kloud_kite_handshake_rejections_total", map[string]string{"reason": reason})
		if !ok {
			t.Fatalf("no kloud_kite_handshake_rejections_total{reason=%q}", reason)
		}
		return v
	}
	alice := e.Dial("alice")

	before := calls(api.MethodVersion, "0")
	if err := alice.Call(ctx, api.MethodVersion, nil, nil); err != nil {
		t.Fatal(err)
	}
	if after := calls(api.MethodVersion, "0"); after != before+1 {
		t.Fatalf("kloud.version ok: %v then %v", before, after)
	}
	// A refused call counts under its code: a member may not add users (-32002).
	before = calls(api.MethodUserAdd, "-32002")
	if err := alice.Call(ctx, api.MethodUserAdd, api.UserAddParams{Username: "mallory"}, nil); err == nil {
		t.Fatal("alice added a user")
	}
	if after := calls(api.MethodUserAdd, "-32002"); after != before+1 {
		t.Fatalf("user.add refused: %v then %v", before, after)
	}
	// A method the kite does not serve is counted as "unknown", whatever its name.
	before = calls(kite.UnknownMethod, "-32601")
	if err := alice.Call(ctx, "no.such.method-"+strconv.Itoa(int(time.Now().UnixNano())), nil, nil); err == nil {
		t.Fatal("unknown method answered")
	}
	if after := calls(kite.UnknownMethod, "-32601"); after != before+1 {
		t.Fatalf("unknown method: %v then %v", before, after)
	}
	if body := metricsOf(t, e); strings.Contains(body, "no.such.method") {
		t.Fatal("a caller's method name became a label")
	}

	// Handshakes: a key kloud did not sign (credential), an empty one (invalid).
	k, err := kite.New(kite.Options{Identity: kite.Identity{Name: "test-client"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	before = rejects(kite.RejectCredential)
	if _, err := k.Dial(ctx, e.URL+"/kite", kite.Auth{Type: kite.AuthKiteKey, Key: "not.a.key"}); err == nil {
		t.Fatal("a bogus key was accepted")
	}
	if after := rejects(kite.RejectCredential); after != before+1 {
		t.Fatalf("credential rejections: %v then %v", before, after)
	}
	before = rejects(kite.RejectInvalid)
	if _, err := k.Dial(ctx, e.URL+"/kite", kite.Auth{Type: kite.AuthKiteKey}); err == nil {
		t.Fatal("an empty key was accepted")
	}
	if after := rejects(kite.RejectInvalid); after != before+1 {
		t.Fatalf("invalid rejections: %v then %v", before, after)
	}

	body := metricsOf(t, e)
	if n, _ := metric(body, "kloud_store_command_duration_seconds_count", map[string]string{"operation": "find"}); n == 0 {
		t.Fatalf("no store find timed:\n%s", grep(body, "kloud_store"))
	}
	if n, _ := metric(body, "kloud_kite_connections", map[string]string{"auth": kite.AuthKiteKey}); n < 1 {
		t.Fatalf("kite connections:\n%s", grep(body, "kloud_kite_connections"))
	}
}

func grep(body, prefix string) string {
	var out []string
	for l := range strings.SplitSeq(body, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestMetricsAccess: on kloud's address /metrics is for administrators (a member's key gets
// 403, nothing 401); on --metrics-addr it is served to anyone.
func TestMetricsAccess(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	maddr := ln.Addr().String()
	ln.Close()
	e := kloudtest.Start(t, kloudtest.Options{MetricsAddr: maddr})
	if _, err := e.Client(kloud.Admin).UserAdd(t.Context(), api.UserAddParams{Username: "alice", Team: model.DefaultTeam}); err != nil {
		t.Fatal(err)
	}
	aliceKey, _, err := e.Server.Kontrol.CreateKey("alice", "")
	if err != nil {
		t.Fatal(err)
	}
	if code, body := testutil.HTTPGet(t, e.URL+"/metrics", ""); code != http.StatusUnauthorized || strings.Contains(body, "kloud_rpc") {
		t.Fatalf("no credential: %d %s", code, body)
	}
	if code, body := testutil.HTTPGet(t, e.URL+"/metrics", aliceKey); code != http.StatusForbidden || strings.Contains(body, "kloud_rpc") {
		t.Fatalf("a member: %d %s", code, body)
	}
	if code, body := testutil.HTTPGet(t, e.URL+"/metrics", "garbage"); code != http.StatusUnauthorized {
		t.Fatalf("a bad credential: %d %s", code, body)
	}
	if body := metricsOf(t, e); !strings.Contains(body, "# TYPE kloud_rpc_calls_total counter") {
		t.Fatalf("admin's scrape:\n%s", body)
	}
	testutil.Eventually(t, 10*time.Second, func() bool {
		code, body := testutil.HTTPGet(t, "http://"+maddr+"/metrics", "")
		return code == http.StatusOK && strings.Contains(body, "kloud_rpc_duration_seconds_bucket")
	}, "--metrics-addr does not serve the metrics")
}

// TestMetricsOfABuildAndATerminal builds a stack (a real klient of the dummy provider, real
// terraform) and opens its terminal: the job, planner, agent, machine, quota and terminal
// metrics say so.
func TestMetricsOfABuildAndATerminal(t *testing.T) {
	t.Parallel()
	e := newTermEnv(t)
	ctx := t.Context()
	if _, err := e.Client(kloud.Admin).QuotaSet(ctx, api.QuotaSetParams{QuotaSubject: api.QuotaSubject{User: "alice"}, Limit: api.Quota{Machines: 5, MemoryMB: 2048}}); err != nil {
		t.Fatal(err)
	}
	kloud.PollMetrics(ctx, e.Server)
	body := metricsOf(t, e.Env)
	want := []struct {
		name   string
		labels map[string]string
		min    float64
		max    float64
	}{
		{"kloud_jobs_finished_total", map[string]string{"kind": "stack.apply", "state": "succeeded"}, 1, 1},
		{"kloud_job_duration_seconds_count", map[string]string{"kind": "stack.apply", "state": "succeeded"}, 1, 1},
		{"kloud_jobs_running", map[string]string{"kind": "stack.apply"}, 0, 0},
		{"kloud_planner_wait_seconds_count", map[string]string{"result": "ok"}, 1, 1},
		{"kloud_planner_waiting_agents", nil, 0, 0},
		{"kloud_kontrol_registered_kites", map[string]string{"kind": "agent"}, 1, 1},
		{"kloud_machine_cpus", map[string]string{"machine": e.machine.ID, "owner": "alice"}, 1, 1e6},
		{"kloud_machine_memory_total_bytes", map[string]string{"machine": e.machine.ID, "owner": "alice"}, 1, 1e15},
		{"kloud_machine_disk_total_bytes", map[string]string{"machine": e.machine.ID, "owner": "alice"}, 1, 1e18},
		{"kloud_quota_used", map[string]string{"subject": "user/alice", "resource": "machines"}, 1, 1},
		{"kloud_quota_limit", map[string]string{"subject": "user/alice", "resource": "machines"}, 5, 5},
		{"kloud_quota_limit", map[string]string{"subject": "user/alice", "resource": "memory_bytes"}, 2048 << 20, 2048 << 20},
		{"kloud_quota_used", map[string]string{"subject": "team/" + model.DefaultTeam, "resource": "machines"}, 1, 1},
		{"kloud_rpc_calls_total", map[string]string{"method": "stack.apply", "code": "0"}, 1, 1},
		{"kloud_terminal_sessions", nil, 0, 0},
	}
	for _, w := range want {
		v, ok := metric(body, w.name, w.labels)
		if !ok || v < w.min || v > w.max {
			t.Errorf("%s%v = %v (found %v), want %v..%v", w.name, w.labels, v, ok, w.min, w.max)
		}
	}
	if t.Failed() {
		t.Fatalf("metrics:\n%s", grep(body, "kloud_"))
	}

	// A terminal: one session while it is open, the bytes typed in and printed out.
	bytes := func(dir string) float64 {
		v, _ := metric(metricsOf(t, e.Env), "kloud_terminal_bytes_total", map[string]string{"direction": dir})
		return v
	}
	in0, out0 := bytes("in"), bytes("out")
	cookie := e.login("alice", "alice-password")
	term := e.mustOpen(cookie, "session=m&cols=80&rows=24")
	term.Type(t, "echo metered-$((6*7))\r")
	term.WaitFor(t, "metered-42")
	if v, _ := metric(metricsOf(t, e.Env), "kloud_terminal_sessions", nil); v != 1 {
		t.Fatalf("terminal sessions while one is open: %v", v)
	}
	if in, out := bytes("in"), bytes("out"); in < in0+float64(len("echo metered-$((6*7))\r")) || out < out0+float64(len("metered-42")) {
		t.Fatalf("terminal bytes: in %v → %v, out %v → %v", in0, in, out0, out)
	}
	term.WS.Close(websocket.StatusNormalClosure, "")
	testutil.Eventually(t, 20*time.Second, func() bool {
		v, _ := metric(metricsOf(t, e.Env), "kloud_terminal_sessions", nil)
		return v == 0
	}, "the closed terminal is still counted")
}
