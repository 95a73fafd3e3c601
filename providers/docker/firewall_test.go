package docker_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/bridgefw"
	"github.com/kloud-dev/kloud/providers/bridgefw/bridgefwtest"
	"github.com/kloud-dev/kloud/providers/docker"
	"github.com/kloud-dev/kloud/providers/docker/dockertest"
)

// readyWait bounds a wait for a machine's server to answer, and a docker exec: python3's start
// in a container took more than 30 s on a host loaded thirty times over (CI).
const readyWait = 2 * time.Minute

// TestFirewall: docker machines are filtered like local ones on a real daemon (dockerd with
// --iptables=false): by default a machine is reached by its owner's machines, not by other
// users'; rules opened through the machine's Firewaller open a port to the team, an address or
// anyone, and closing shuts it again; a container started through the proxy (as terraform
// starts it) is in the table before the caller hears back, and keeps its rules across a restart
// (a new veth); one started behind kloud's back is unreachable until the next rebuild (the table
// fails closed) until kloud looks at it (Info); a forged source address gains nothing; the table
// and the rules go with the network.
func TestFirewall(t *testing.T) {
	t.Parallel()
	testFirewall(t, newFixture(t, "fw1"), "fw1")
}

// TestFirewallStockDockerd: TestFirewall on a host with a stock dockerd: in a network namespace
// of the test's own (bridgefwtest) where br_netfilter is on and iptables-legacy's FORWARD policy
// is DROP, a real dockerd managing iptables (its chains, its own FORWARD policy DROP in
// iptables-nft, its rules for the machines' network) runs the machines. Docker's rules accept
// only in the variant it manages; kloud's ACCEPT for its bridge (providers/bridgefw hostfw.go) is
// what lets the owner's machines reach each other, and the table still keeps everyone else out.
func TestFirewallStockDockerd(t *testing.T) {
	t.Parallel()
	if !bridgefwtest.StockDockerHost(t) {
		return
	}
	dd := dockertest.NewWith(t, dockertest.Options{IPTables: true})
	if out, err := exec.Command("iptables", "-w", "5", "-S").CombinedOutput(); err != nil || !strings.Contains(string(out), "-N DOCKER-USER") {
		t.Fatalf("the daemon does not manage iptables: %v\n%s", err, out)
	}
	f := newFixtureOn(t, "fwsd", dd, nil)
	testFirewall(t, f, "fwsd")
	for _, v := range []string{"iptables-legacy", "iptables-nft"} {
		if out, err := exec.Command(v, "-w", "5", "-S", "FORWARD").CombinedOutput(); err != nil || !strings.Contains(string(out), "-P FORWARD DROP") || strings.Contains(string(out), "kloud bridge") {
			t.Errorf("%s FORWARD after the network went (policy DROP, no kloud rule): %v\n%s", v, err, out)
		}
	}
}

func testFirewall(t *testing.T, f *fixture, instance string) {
	if why := f.d.FirewallUnusable(); why != "" {
		testutil.Unavailable(t, "the docker firewall cannot work here: %s", why)
	}
	ctx := t.Context()
	cli := f.dd.Client
	owners := map[string][2]string{"m0": {"alice", "red"}, "m1": {"alice", "red"}, "m2": {"bob", "red"}, "m3": {"carol", "blue"}, "m4": {"bob", "red"}}
	pc, image := f.stackProxy(t, []string{owners["m0"][0], owners["m1"][0], owners["m2"][0], owners["m3"][0], owners["m4"][0]})

	// The containers: made with the daemon's client (a plain command instead of the boot
	// script, which needs the seed), with the labels ApplyTemplate gives; started through the
	// proxy, as terraform does.
	ids := map[string]string{}
	create := func(m string) string {
		t.Helper()
		c, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{Name: "kloud-fw-" + m,
			Config: &container.Config{Image: image, Entrypoint: []string{"sleep", "infinity"}, StopSignal: "SIGKILL",
				Labels: map[string]string{docker.LabelStack: "s1", docker.LabelMachine: m, docker.LabelInstance: instance,
					docker.LabelOwner: owners[m][0], docker.LabelTeam: owners[m][1]}},
			HostConfig: &container.HostConfig{NetworkMode: container.NetworkMode(f.d.Network())}})
		if err != nil {
			t.Fatal(err)
		}
		ids[m] = c.ID
		return c.ID
	}
	for _, m := range []string{"m0", "m1", "m2", "m3"} {
		if _, err := pc.ContainerStart(ctx, create(m), client.ContainerStartOptions{}); err != nil {
			t.Fatalf("start %s through the proxy: %v", m, err)
		}
	}
	ip := func(m string) string {
		t.Helper()
		res, err := cli.ContainerInspect(ctx, ids[m], client.ContainerInspectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return res.Container.NetworkSettings.Networks[f.d.Network()].IPAddress.String()
	}
	exec := func(m string, args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(ctx, readyWait)
		defer cancel()
		return f.dd.CLI(ctx, append([]string{"exec", ids[m]}, args...)...)
	}
	serve := func(m string) {
		t.Helper()
		if _, err := exec(m, "sh", "-c", "mkdir -p /srv && echo from-"+m+" > /srv/index.html && cd /srv && setsid python3 -m http.server 8080 >/dev/null 2>&1 </dev/null &"); err != nil {
			t.Fatal(err)
		}
	}
	reach := func(from, to string) bool {
		out, err := exec(from, "curl", "-s", "--noproxy", "*", "-m", "3", "http://"+ip(to)+":8080/index.html")
		return err == nil && strings.TrimSpace(out) == "from-"+to
	}
	serve("m0")
	testutil.Eventually(t, readyWait, func() bool { return reach("m1", "m0") }, "the owner's other machine cannot reach m0")
	check := func(when string, want map[string]bool) {
		t.Helper()
		for _, from := range []string{"m1", "m2", "m3"} {
			got := reach(from, "m0")
			for try := 1; !got && want[from] && try < 3; try++ {
				got = reach(from, "m0") // an allowed curl that ran out of its 3 s on a loaded host
			}
			if got != want[from] {
				t.Errorf("%s: %s reaches m0: %v, want %v", when, from, got, want[from])
			}
		}
	}
	check("default", map[string]bool{"m1": true})
	if _, err := exec("m2", "ping", "-c", "1", "-W", "2", ip("m0")); err == nil {
		t.Error("another user's machine pings m0")
	}
	// The host (kloud) reaches every machine.
	hc := &http.Client{Timeout: 5 * time.Second}
	if res, err := hc.Get("http://" + ip("m0") + ":8080/index.html"); err != nil {
		t.Errorf("the host cannot reach m0: %v", err)
	} else {
		res.Body.Close()
	}

	mach := func(m string) provider.Firewaller {
		t.Helper()
		pm, err := f.d.Provider().Machine(&provider.BaseMachine{Provider: f.d.Provider(), ID: m, Label: "vm." + m[1:], Attributes: map[string]any{"id": ids[m]}})
		if err != nil {
			t.Fatal(err)
		}
		fw, ok := pm.(provider.Firewaller)
		if !ok {
			t.Fatal("a docker machine is no Firewaller")
		}
		return fw
	}
	fw := mach("m0")
	rules, err := fw.OpenPorts(ctx, []provider.PortRule{{Port: 8080, Protocol: "tcp", From: "team"}})
	if err != nil || len(rules) != 1 {
		t.Fatalf("open to the team: %+v %v", rules, err)
	}
	check("open to the team", map[string]bool{"m1": true, "m2": true})
	if _, err := fw.OpenPorts(ctx, []provider.PortRule{{Port: 8080, Protocol: "tcp", From: ip("m3") + "/32"}}); err != nil {
		t.Fatal(err)
	}
	check("open to m3's address", map[string]bool{"m1": true, "m2": true, "m3": true})
	if _, err := fw.ClosePorts(ctx, []provider.PortRule{{Port: 8080, Protocol: "tcp", From: "team"}}); err != nil {
		t.Fatal(err)
	}
	check("team closed", map[string]bool{"m1": true, "m3": true})

	// A forged source address gains nothing: m2 (bob) claiming m3's address is dropped on the
	// way in, though m3's address may connect (a UDP datagram: no answer needed).
	if _, err := fw.OpenPorts(ctx, []provider.PortRule{{Port: 9999, Protocol: "udp", From: ip("m3") + "/32"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := exec("m0", "sh", "-c", "setsid python3 -c 'import socket\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\ns.bind((\"0.0.0.0\",9999))\nwhile True:\n d,a=s.recvfrom(100)\n open(\"/tmp/udp.log\",\"a\").write(d.decode()+\"\\n\")' >/dev/null 2>&1 </dev/null &"); err != nil {
		t.Fatal(err)
	}
	sendUDP := func(from, srcIP, word string) {
		t.Helper()
		// A raw IPv4/UDP packet with the given source address (CAP_NET_RAW, docker's default).
		py := fmt.Sprintf(`import socket,struct
def ck(b):
    if len(b)%%2: b+=b"\0"
    s=sum(struct.unpack("!%%dH"%%(len(b)//2),b)); s=(s>>16)+(s&0xffff); s+=s>>16
    return (~s)&0xffff
src,dst,data=socket.inet_aton(%q),socket.inet_aton(%q),%q.encode()
udp=struct.pack("!HHHH",40000,9999,8+len(data),0)+data
ip=struct.pack("!BBHHHBBH4s4s",0x45,0,20+len(udp),1,0,64,17,0,src,dst)
ip=ip[:10]+struct.pack("!H",ck(ip))+ip[12:]
s=socket.socket(socket.AF_INET,socket.SOCK_RAW,socket.IPPROTO_RAW)
s.sendto(ip+udp,(%q,0))`, srcIP, ip("m0"), word, ip("m0"))
		if out, err := exec(from, "python3", "-c", py); err != nil {
			t.Fatal(out, err)
		}
	}
	sendUDP("m2", ip("m3"), "forged")
	sendUDP("m3", ip("m3"), "honest")
	testutil.Eventually(t, 10*time.Second, func() bool {
		out, _ := exec("m0", "cat", "/tmp/udp.log")
		return strings.Contains(out, "honest")
	}, "m3's own datagram did not arrive")
	if out, _ := exec("m0", "cat", "/tmp/udp.log"); strings.Contains(out, "forged") {
		t.Error("a datagram with a forged source address got through")
	}
	if _, err := fw.ClosePorts(ctx, []provider.PortRule{{Port: 9999, Protocol: "udp", From: ip("m3") + "/32"}}); err != nil {
		t.Fatal(err)
	}

	// Restarted through the proxy (a new veth), m0 keeps its rules; started through the
	// provider too.
	if _, err := pc.ContainerRestart(ctx, ids["m0"], client.ContainerRestartOptions{}); err != nil {
		t.Fatal(err)
	}
	serve("m0")
	// The rules come back after the container does, not all at once: wait for both sources.
	testutil.Eventually(t, readyWait, func() bool { return reach("m1", "m0") && reach("m3", "m0") }, "after a restart the owner's machine or m3 cannot reach m0")
	check("after a restart", map[string]bool{"m1": true, "m3": true})
	pm, _ := f.d.Provider().Machine(&provider.BaseMachine{Provider: f.d.Provider(), ID: "m0", Label: "vm.0", Attributes: map[string]any{"id": ids["m0"]}})
	if _, err := pm.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pm.Start(ctx); err != nil {
		t.Fatal(err)
	}
	serve("m0")
	testutil.Eventually(t, readyWait, func() bool { return reach("m1", "m0") && reach("m3", "m0") }, "after Start the owner's machine or m3 cannot reach m0")
	check("after Start", map[string]bool{"m1": true, "m3": true})
	if got, err := fw.Ports(ctx); err != nil || len(got) != 1 || got[0].From != ip("m3")+"/32" {
		t.Errorf("rules after restarts: %+v %v", got, err)
	}

	// Started behind kloud's back, m4 (bob's) is not in the table: nobody reaches it, not even
	// bob's m2, until the table is rebuilt.
	if _, err := cli.ContainerStart(ctx, create("m4"), client.ContainerStartOptions{}); err != nil {
		t.Fatal(err)
	}
	serve("m4")
	time.Sleep(time.Second)
	if reach("m2", "m4") || reach("m3", "m4") {
		t.Error("a container the table does not know is reachable from other machines")
	}
	// kloud looking at it (machine.info) sees it started after the last rebuild: rebuilt.
	pm4, _ := f.d.Provider().Machine(&provider.BaseMachine{Provider: f.d.Provider(), ID: "m4", Label: "vm.4", Attributes: map[string]any{"id": ids["m4"]}})
	if st, _, err := pm4.Info(ctx); err != nil || st != provider.Running {
		t.Fatalf("info of m4: %v %v", st, err)
	}
	testutil.Eventually(t, readyWait, func() bool { return reach("m2", "m4") }, "after Info bob's m2 cannot reach his m4")
	if reach("m3", "m4") {
		t.Error("carol's m3 reaches bob's m4")
	}

	// Bad rules are refused; a rule file goes with its container; the table goes with the
	// network.
	for _, bad := range []provider.PortRule{{Port: 0, Protocol: "tcp", From: "any"}, {Port: 1, Protocol: "sctp", From: "any"}, {Port: 1, Protocol: "tcp", From: "nobody"}} {
		if _, err := fw.OpenPorts(ctx, []provider.PortRule{bad}); err == nil {
			t.Errorf("rule %+v accepted", bad)
		}
	}
	if _, err := mach("m2").OpenPorts(ctx, []provider.PortRule{{Port: 22, Protocol: "tcp", From: "any"}}); err != nil {
		t.Fatal(err)
	}
	rulesDir := filepath.Join(f.d.StateDir(), "firewall")
	if _, err := pc.ContainerRemove(ctx, ids["m2"], client.ContainerRemoveOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	files, _ := os.ReadDir(rulesDir)
	var names []string
	for _, e := range files {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, []string{"m0.json"}) {
		t.Errorf("rules files after m2's container went: %v, want [m0.json]", names)
	}
	tb := bridgefw.NewTable("kt-"+instance, f.d.Subnet())
	if ok, err := tb.Exists(); err != nil || !ok || tb.Name != f.d.FirewallTable() {
		t.Fatalf("table %s exists: %v %v", f.d.FirewallTable(), ok, err)
	}
	for _, m := range []string{"m0", "m1", "m3", "m4"} {
		if _, err := pc.ContainerRemove(ctx, ids[m], client.ContainerRemoveOptions{Force: true}); err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := tb.Exists(); err != nil || ok {
		t.Errorf("table %s after the network went: exists %v %v", tb.Name, ok, err)
	}
	if _, err := os.Stat(rulesDir); !os.IsNotExist(err) {
		t.Errorf("rules dir after the last container: %v", err)
	}
}

// TestFirewallAdvertised: the capability is advertised only where the firewall can work: not
// for a daemon reached over TCP (its bridge is on another host), nor when turned off.
func TestFirewallAdvertised(t *testing.T) {
	t.Parallel()
	for _, o := range []docker.Options{
		{Host: "tcp://127.0.0.1:1", NoFirewall: false},
		{Host: "unix:///nonexistent.sock", NoFirewall: true},
	} {
		o.Image, o.StateDir = "kloud", t.TempDir()
		d, err := docker.New(o)
		if err != nil {
			t.Fatal(err)
		}
		if d.Provider().Can(provider.CapFirewall) || d.FirewallUnusable() == "" {
			t.Errorf("%+v: firewall advertised (%q)", o, d.FirewallUnusable())
		}
	}
	if os.Geteuid() != 0 {
		return
	}
	d, err := docker.New(docker.Options{Host: "unix:///nonexistent.sock", Image: "kloud", StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if !d.Provider().Can(provider.CapFirewall) {
		t.Errorf("a local daemon as root: firewall not advertised: %s", d.FirewallUnusable())
	}
}
