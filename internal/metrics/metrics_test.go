package metrics_test

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kloud-dev/kloud/internal/metrics"
	"github.com/kloud-dev/kloud/kite"
)

// TestKiteLabelsStayBounded: a code outside the protocol (a peer's error passed on) counts as
// "other"; the protocol's codes keep their value; every rejection reason is exported from the
// start, at 0.
func TestKiteLabelsStayBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := metrics.NewKite(reg, "test")
	m.Served("a.method", 0, time.Millisecond)
	m.Served("a.method", kite.CodeNotFound, time.Millisecond)
	for code := int64(-40000); code < -39990; code++ {
		m.Served("a.method", code, time.Millisecond)
	}
	m.HandshakeRejected(kite.RejectCredential)
	n, err := promtest.GatherAndCount(reg, "test_rpc_calls_total")
	if err != nil {
		t.Fatal(err)
	}
	if n != 3 {
		t.Fatalf("%d series of test_rpc_calls_total, want 3 (0, -32003, other)", n)
	}
	want := `
# HELP test_kite_handshake_rejections_total Kite handshakes refused, by reason (invalid, credential, refused, repeated, timeout).
# TYPE test_kite_handshake_rejections_total counter
test_kite_handshake_rejections_total{reason="credential"} 1
test_kite_handshake_rejections_total{reason="invalid"} 0
test_kite_handshake_rejections_total{reason="refused"} 0
test_kite_handshake_rejections_total{reason="repeated"} 0
test_kite_handshake_rejections_total{reason="timeout"} 0
# HELP test_rpc_calls_total Kite RPC calls served, by method and JSON-RPC code (0: success).
# TYPE test_rpc_calls_total counter
test_rpc_calls_total{code="-32003",method="a.method"} 1
test_rpc_calls_total{code="0",method="a.method"} 1
test_rpc_calls_total{code="other",method="a.method"} 10
`
	if err := promtest.GatherAndCompare(reg, stringsReader(want), "test_rpc_calls_total", "test_kite_handshake_rejections_total"); err != nil {
		t.Fatal(err)
	}
}

func stringsReader(s string) *strings.Reader { return strings.NewReader(s) }
