package bridgefw_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/providers/bridgefw"
	"github.com/kloud-dev/kloud/providers/bridgefw/bridgefwtest"
)

// TestHostForwardStockDocker: on a host whose firewall is a stock dockerd's (br_netfilter on,
// iptables FORWARD policy DROP in iptables-legacy and iptables-nft; in a network namespace of
// the test's own), machines on a bridge with kloud's table reach the machines of their group
// and nothing more: Apply puts kloud's ACCEPT for the bridge's own traffic into every variant's
// FORWARD once (idempotent), HostForward says so, and Remove takes it away again (the bridge's
// traffic is then dropped by the host as before).
func TestHostForwardStockDocker(t *testing.T) {
	if !bridgefwtest.StockDockerHost(t) {
		return
	}
	ctx := t.Context()
	sh := func(args ...string) {
		t.Helper()
		if out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	b := make([]byte, 3)
	rand.Read(b)
	id := hex.EncodeToString(b)
	br := "kfw" + id
	sh("ip", "link", "add", br, "type", "bridge")
	t.Cleanup(func() { exec.Command("ip", "link", "del", br).Run() })
	sh("ip", "link", "set", br, "up")
	subnet := netip.MustParsePrefix("10.200.77.0/24")
	machines := map[string]bridgefw.Machine{}
	for i, name := range []string{"a", "b", "c"} {
		ns, port := "kfw-"+id+"-"+name, "kfh"+id+name
		sh("ip", "netns", "add", ns)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
		sh("ip", "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
		ip := netip.AddrFrom4([4]byte{10, 200, 77, byte(2 + i)})
		sh("ip", "-n", ns, "addr", "add", ip.String()+"/24", "dev", "eth0")
		sh("ip", "-n", ns, "link", "set", "eth0", "up")
		sh("ip", "link", "set", port, "master", br, "up")
		group := "owner:alice"
		if name == "c" {
			group = "owner:bob"
		}
		machines[name] = bridgefw.Machine{ID: name, Port: port, IP: ip, Group: group}
	}
	// Each machine listens on TCP 8080; reaching one is a connect that succeeds.
	for name := range machines {
		srv := exec.Command("ip", "netns", "exec", "kfw-"+id+"-"+name, "python3", "-c",
			"import socket\ns=socket.create_server(('0.0.0.0',8080))\nwhile True: s.accept()[0].close()")
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })
	}
	ping := func(from, to string) bool {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		py := "import socket,sys\nfor i in range(20):\n try:\n  socket.create_connection(('" + machines[to].IP.String() + "',8080),timeout=1); sys.exit(0)\n except ConnectionRefusedError: pass\nsys.exit(1)"
		return exec.CommandContext(ctx, "ip", "netns", "exec", "kfw-"+id+"-"+from, "python3", "-c", py).Run() == nil
	}
	tb := bridgefw.NewTable(br, subnet)
	t.Cleanup(func() { tb.Remove(context.Background()) })
	before := tb.HostForward(ctx)
	if !before.Drops() || !before.Blocked() {
		t.Fatalf("the namespace's firewall does not drop bridged frames: %+v", before)
	}
	if ping("a", "b") {
		t.Fatal("a reaches b before kloud's table: the namespace's FORWARD does not drop")
	}
	for range 2 {
		if err := tb.Apply(ctx, []bridgefw.Machine{machines["a"], machines["b"], machines["c"]}); err != nil {
			t.Fatal(err)
		}
	}
	if !ping("a", "b") || !ping("b", "a") {
		t.Errorf("alice's machines do not reach each other beside a stock dockerd's firewall")
	}
	if ping("c", "a") {
		t.Errorf("bob's machine reaches alice's: kloud's ACCEPT opened more than its table allows")
	}
	after := tb.HostForward(ctx)
	if !after.Drops() || after.Blocked() || len(after.Variants) == 0 {
		t.Errorf("after Apply: %+v", after)
	}
	t.Log(after.String())
	for _, v := range after.Variants {
		out, err := exec.CommandContext(ctx, v.Name, "-w", "5", "-S", "FORWARD").CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v: %s", v.Name, err, out)
		}
		if n := strings.Count(string(out), "kloud bridge "+br); n != 1 || !v.Accepts {
			t.Errorf("%s FORWARD after two Applies has kloud's rule %d times (accepts %v):\n%s", v.Name, n, v.Accepts, out)
		}
	}
	if err := tb.Remove(ctx); err != nil {
		t.Fatal(err)
	}
	for _, v := range tb.HostForward(ctx).Variants {
		if v.Accepts {
			t.Errorf("%s: kloud's rule outlived the table", v.Name)
		}
	}
	if ping("a", "b") {
		t.Error("after Remove a still reaches b: something else than kloud's rule let it through")
	}
}
