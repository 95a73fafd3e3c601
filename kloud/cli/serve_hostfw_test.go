package cli

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"os/exec"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/bridgefw/bridgefwtest"
	"github.com/kloud-dev/kloud/providers/local"
)

// TestServeSaysHostFirewall: on a host whose firewall is a stock dockerd's (br_netfilter on,
// FORWARD policy DROP; a network namespace of the test's own), kloud serve's local provider says
// at startup that the host's firewall would drop its machines' traffic and that kloud accepted
// its bridge's own traffic in FORWARD, and the rule is there when it says so.
func TestServeSaysHostFirewall(t *testing.T) {
	t.Parallel()
	if !bridgefwtest.StockDockerHost(t) {
		return
	}
	b := make([]byte, 3)
	rand.Read(b)
	bridge := "kst" + hex.EncodeToString(b)
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	f := &serveFlags{}
	f.o.DataDir, f.o.Addr = t.TempDir(), "127.0.0.1:7000"
	sl := &serveLocal{o: local.Options{StateDir: t.TempDir(), Bridge: bridge}, subnet: "10.200.91.0/24"}
	if err := sl.register(t.Context(), f, provider.NewRegistry(), log); err != nil {
		t.Fatal(err)
	}
	if err := sl.l.Available(); err != nil {
		testutil.Unavailable(t, "the local provider: %v", err)
	}
	t.Log(logs.String())
	var said string
	for line := range strings.Lines(logs.String()) {
		if strings.Contains(line, "host's firewall") {
			said = line
		}
	}
	for _, want := range []string{"level=INFO", "local provider: the host's firewall would drop traffic between machines on bridge " + bridge,
		"FORWARD policy DROP", "kloud accepts traffic within the bridge at the top of FORWARD"} {
		if !strings.Contains(said, want) {
			t.Errorf("kloud serve's startup log does not say %q", want)
		}
	}
	for _, v := range []string{"iptables-legacy", "iptables-nft"} {
		if out, err := exec.Command(v, "-w", "5", "-S", "FORWARD").CombinedOutput(); err != nil || !strings.Contains(string(out), "-A FORWARD -i "+bridge+" -o "+bridge) {
			t.Errorf("%s FORWARD has no rule of kloud's for %s: %v\n%s", v, bridge, err, out)
		}
	}
}
