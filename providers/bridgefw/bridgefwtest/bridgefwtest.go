// Package bridgefwtest runs a test on a host whose firewall is what a stock Docker daemon leaves
// behind (br_netfilter on: bridge-nf-call-iptables=1; iptables' FORWARD policy DROP, in both
// iptables-legacy and iptables-nft), without touching the host's: the test binary runs the test
// again in a network and mount namespace of its own (unshare), where it sets those conditions
// (iptables tables and the br_netfilter sysctls are per network namespace), with its own /sys
// (the namespace's interfaces) and the host's cgroup mounts. Everything the namespace holds
// (bridges, veths, iptables rules, a dockerd's networks) goes with it when the test's processes
// have exited.
//
//	func TestX(t *testing.T) {
//		if !bridgefwtest.StockDockerHost(t) {
//			return // ran in its namespace: the result is reported here
//		}
//		... // in the namespace
//	}
package bridgefwtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
)

// envInside names the test the process runs in its namespace.
const envInside = "KLOUD_TEST_STOCK_DOCKER_HOST"

// setup runs in the new namespaces (as sh -c, "$1" the directory for the cgroup mounts, the
// test binary and its arguments after it): its own sysfs over /sys with the host's cgroup
// mounts kept, loopback up, bridged frames through iptables, FORWARD policy DROP in every
// iptables variant.
const setup = `set -e
cg="$1"; shift
mount --make-rslave /
mount --rbind /sys/fs/cgroup "$cg"
mount -t sysfs sysfs /sys
mount --rbind "$cg" /sys/fs/cgroup
ip link set lo up
echo 1 > /proc/sys/net/bridge/bridge-nf-call-iptables
echo 1 > /proc/sys/net/bridge/bridge-nf-call-ip6tables
for ipt in iptables-legacy iptables-nft; do
	if command -v $ipt >/dev/null; then $ipt -w 5 -P FORWARD DROP; fi
done
exec "$@"
`

// Inside reports whether this process is the test run in its namespace.
func Inside() bool { return os.Getenv(envInside) != "" }

// StockDockerHost runs test t (a top-level test) again in a namespace with a stock dockerd's
// firewall conditions and reports its result as t's; it returns false then. In that namespace
// it returns true: the test goes on there. Subtests, if given, are the only subtests of t run
// there. It needs root, unshare, ip and iptables (skipped loudly without, failed under CI=true).
func StockDockerHost(t *testing.T, subtests ...string) bool {
	t.Helper()
	if os.Getenv(envInside) == t.Name() {
		t.Log("in a network namespace of its own: bridge-nf-call-iptables=1, iptables FORWARD policy DROP")
		return true
	}
	testutil.RequireRoot(t)
	testutil.RequireBinary(t, "unshare")
	testutil.RequireBinary(t, "ip")
	if _, err := os.Stat("/proc/sys/net/bridge/bridge-nf-call-iptables"); err != nil {
		testutil.Unavailable(t, "br_netfilter is not loaded (modprobe br_netfilter): %v", err)
	}
	_, errL := exec.LookPath("iptables-legacy")
	_, errN := exec.LookPath("iptables-nft")
	if errL != nil && errN != nil {
		testutil.Unavailable(t, "neither iptables-legacy nor iptables-nft is installed (apt-get install iptables)")
	}
	cg := filepath.Join(t.TempDir(), "cgroup")
	if err := os.Mkdir(cg, 0o700); err != nil {
		t.Fatal(err)
	}
	run := "^" + regexp.QuoteMeta(t.Name()) + "$"
	if len(subtests) > 0 {
		for i, st := range subtests {
			subtests[i] = regexp.QuoteMeta(st)
		}
		run += "/^(" + strings.Join(subtests, "|") + ")$"
	}
	args := []string{"--net", "--mount", "--propagation", "slave", "--", "sh", "-c", setup, "sh", cg,
		os.Args[0], "-test.run", run, "-test.v", "-test.count=1"}
	for _, a := range os.Args[1:] {
		if strings.HasPrefix(a, "-test.timeout") {
			args = append(args, a)
		}
	}
	cmd := exec.CommandContext(t.Context(), "unshare", args...)
	cmd.Env = append(os.Environ(), envInside+"="+t.Name())
	out, err := cmd.CombinedOutput()
	t.Logf("in its own network namespace:\n%s", out)
	if err != nil {
		t.Fatalf("the test in its own network namespace: %v", err)
	}
	if m := regexp.MustCompile(`(?m)^--- SKIP: ` + regexp.QuoteMeta(t.Name()) + `\b`).Find(out); m != nil {
		t.Skip("skipped in its own network namespace (see above)")
	}
	if !regexp.MustCompile(`(?m)^--- PASS: ` + regexp.QuoteMeta(t.Name()) + `\b`).Match(out) {
		t.Fatal("the test did not pass in its own network namespace")
	}
	return false
}
