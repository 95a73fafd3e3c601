package cli

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/local"
)

// TestReachWarnings: kloud serve warns when its listen address is one its machines cannot
// reach, with the local provider's real machine URL (the bridge address), and says what to use.
func TestReachWarnings(t *testing.T) {
	t.Parallel()
	l, err := local.New(local.Options{StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	l2, err := local.New(local.Options{StateDir: t.TempDir(), Subnet: netip.MustParsePrefix("10.201.7.0/24")})
	if err != nil {
		t.Fatal(err)
	}
	// The providers as kloud serve registers them, minus Available (it depends on the host).
	withLocal := func(l *local.Local) *provider.Registry {
		reg := provider.NewRegistry()
		p := *l.Provider()
		p.Available = nil
		reg.Register(&p)
		reg.Register(&provider.Provider{Name: "dummy", ResourceType: "terraform_data"})
		return reg
	}
	tcp := func(s string) net.Addr { return net.TCPAddrFromAddrPort(netip.MustParseAddrPort(s)) }
	for _, tc := range []struct {
		name   string
		listen net.Addr
		public string
		reg    *provider.Registry
		want   []string // one substring set per warning, in provider order
	}{
		{"loopback with local", tcp("127.0.0.1:7000"), "http://127.0.0.1:7000", withLocal(l),
			[]string{"machines of provider local reach kloud at http://10.200.0.1:7000", "--addr :7000", "--addr 10.200.0.1:7000"}},
		{"loopback, other subnet", tcp("127.0.0.1:7123"), "http://127.0.0.1:7123", withLocal(l2),
			[]string{"provider local", "--addr 10.201.7.1:7123"}},
		{"all addresses", tcp("[::]:7000"), "http://127.0.0.1:7000", withLocal(l), nil},
		{"all IPv4 addresses", tcp("0.0.0.0:7000"), "http://127.0.0.1:7000", withLocal(l), nil},
		{"the bridge address: dummy machines dial loopback", tcp("10.200.0.1:7000"), "http://127.0.0.1:7000", withLocal(l),
			[]string{"machines of provider dummy reach kloud at http://127.0.0.1:7000", "--addr 127.0.0.1:7000"}},
		{"the bridge address with a public URL on it", tcp("10.200.0.1:7000"), "http://10.200.0.1:7000", withLocal(l),
			nil},
		{"a proxy in front (other port)", tcp("127.0.0.1:7000"), "https://kloud.example.test", withLocal(l), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := reachWarnings(t.Context(), tc.listen, tc.public, tc.reg)
			if len(tc.want) == 0 {
				if len(got) != 0 {
					t.Fatalf("unexpected warnings: %q", got)
				}
				return
			}
			if len(got) != 1 {
				t.Fatalf("want one warning, got %q", got)
			}
			for _, w := range tc.want {
				if !strings.Contains(got[0], w) {
					t.Errorf("warning %q does not say %q", got[0], w)
				}
			}
		})
	}
	// An unavailable provider builds nothing: no warning for it.
	reg := provider.NewRegistry()
	p := *l.Provider()
	p.Available = func() error { return errors.New("not root") }
	reg.Register(&p)
	if got := reachWarnings(t.Context(), tcp("127.0.0.1:7000"), "http://127.0.0.1:7000", reg); len(got) != 0 {
		t.Fatalf("warning for an unavailable provider: %q", got)
	}
}
