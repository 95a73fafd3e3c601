package sandbox_test

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/providers/bridgefw/bridgefwtest"
	"github.com/kloud-dev/kloud/providers/local/sandbox"
)

// TestFirewall: by default a machine is reachable from its owner's machines and the host, not
// from other users' machines; rules open a port to the team, a CIDR or anyone, and closing
// them shuts it again; the table goes with the network.
func TestFirewall(t *testing.T) { testFirewall(t) }

// TestFirewallStockDockerd: TestFirewall on a host whose firewall is what a stock dockerd leaves
// (also after it stopped): br_netfilter on and iptables' FORWARD policy DROP, in iptables-legacy
// and iptables-nft, in a network namespace of the test's own (bridgefwtest). Bridged frames
// between the machines traverse iptables there; kloud's ACCEPT for its bridge's own traffic
// (providers/bridgefw hostfw.go) lets the owner's machines reach each other, the table still keeps
// the others out, and the rule goes with the network.
func TestFirewallStockDockerd(t *testing.T) {
	if !bridgefwtest.StockDockerHost(t) {
		return
	}
	testFirewall(t)
	for _, v := range []string{"iptables-legacy", "iptables-nft"} {
		if out, err := exec.Command(v, "-w", "5", "-S", "FORWARD").CombinedOutput(); err != nil || !strings.Contains(string(out), "-P FORWARD DROP") || strings.Contains(string(out), "kloud bridge") {
			t.Errorf("%s FORWARD after the network went (policy DROP, no kloud rule): %v\n%s", v, err, out)
		}
	}
}

func testFirewall(t *testing.T) {
	e := newEnv(t)
	tags := func(owner, team string) map[string]string {
		return map[string]string{"kloud_owner": owner, "kloud_team": team, "kloud_stack": "s-" + owner}
	}
	a := e.create(t, sandbox.Spec{ID: "fw-a", Tags: tags("alice", "red")})
	b := e.create(t, sandbox.Spec{ID: "fw-b", Tags: tags("alice", "red")})
	c := e.create(t, sandbox.Spec{ID: "fw-c", Tags: tags("bob", "red")})
	d := e.create(t, sandbox.Spec{ID: "fw-d", Tags: tags("carol", "blue")})
	e.exec(t, a.ID, "sh", "-c", "echo from-a > /tmp/index.html; cd /tmp && setsid python3 -m http.server 8080 >/dev/null 2>&1 < /dev/null &")
	url := fmt.Sprintf("http://%s:8080/index.html", a.IP)
	reach := func(from sandbox.Info) bool {
		out, err := e.m.Exec(t.Context(), from.ID, "curl", "-s", "--noproxy", "*", "-m", "2", url)
		return err == nil && strings.TrimSpace(string(out)) == "from-a"
	}
	testutil.Eventually(t, 30*time.Second, func() bool { return reach(b) }, "the owner's other machine cannot reach a")
	check := func(when string, want map[string]bool) {
		t.Helper()
		for _, m := range []sandbox.Info{b, c, d} {
			if got := reach(m); got != want[m.ID] {
				t.Errorf("%s: %s reaches a: %v, want %v", when, m.ID, got, want[m.ID])
			}
		}
	}
	check("default", map[string]bool{"fw-b": true})
	if _, err := e.m.Exec(t.Context(), c.ID, "ping", "-c", "1", "-W", "2", a.IP.String()); err == nil {
		t.Error("another user's machine pings a")
	}
	rules, err := e.m.OpenPorts(t.Context(), a.ID, []sandbox.FirewallRule{{Port: 8080, From: "team"}})
	if err != nil || len(rules) != 1 || rules[0].Protocol != "tcp" {
		t.Fatalf("open to the team: %+v %v", rules, err)
	}
	check("open to the team", map[string]bool{"fw-b": true, "fw-c": true})
	if _, err := e.m.OpenPorts(t.Context(), a.ID, []sandbox.FirewallRule{{Port: 8080, Protocol: "tcp", From: d.IP.String() + "/32"}}); err != nil {
		t.Fatal(err)
	}
	check("open to d's address", map[string]bool{"fw-b": true, "fw-c": true, "fw-d": true})
	if _, err := e.m.ClosePorts(t.Context(), a.ID, []sandbox.FirewallRule{{Port: 8080, From: "team"}}); err != nil {
		t.Fatal(err)
	}
	check("team closed", map[string]bool{"fw-b": true, "fw-d": true})
	if _, err := e.m.OpenPorts(t.Context(), a.ID, []sandbox.FirewallRule{{Port: 8080, From: "any"}}); err != nil {
		t.Fatal(err)
	}
	check("open to any", map[string]bool{"fw-b": true, "fw-c": true, "fw-d": true})
	got, err := e.m.Firewall(t.Context(), a.ID)
	if err != nil || len(got) != 2 {
		t.Fatalf("rules: %+v %v", got, err)
	}
	for _, bad := range []sandbox.FirewallRule{{Port: 0, From: "any"}, {Port: 1, Protocol: "sctp", From: "any"}, {Port: 1, From: "nobody"}, {Port: 1, From: "::1/128"}} {
		if _, err := e.m.OpenPorts(t.Context(), a.ID, []sandbox.FirewallRule{bad}); err == nil {
			t.Errorf("rule %+v accepted", bad)
		}
	}
	// Stopped and started again, the rules are still there.
	if _, err := e.m.Stop(t.Context(), a.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Start(t.Context(), a.ID); err != nil {
		t.Fatal(err)
	}
	e.exec(t, a.ID, "sh", "-c", "echo from-a > /tmp/index.html; cd /tmp && setsid python3 -m http.server 8080 >/dev/null 2>&1 < /dev/null &")
	testutil.Eventually(t, 30*time.Second, func() bool { return reach(b) }, "after a restart, a's server is not reachable from the owner's machine")
	if !reach(c) {
		t.Error("after a restart, the open port is closed")
	}

	// The table goes with the network.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := e.m.GC(ctx, func(sandbox.Info) bool { return false }); err != nil {
		t.Fatal(err)
	}
	if err := e.m.TeardownNetwork(ctx); err != nil {
		t.Fatal(err)
	}
	conn, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	tables, err := conn.ListTablesOfFamily(nftables.TableFamilyBridge)
	if err != nil {
		t.Fatal(err)
	}
	for _, tb := range tables {
		if tb.Name == e.m.FirewallTable() {
			t.Errorf("table %s outlived the network", tb.Name)
		}
	}
}
