package sandbox

import (
	"crypto/rand"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/netip"
)

// FreeSubnet picks at random a 10.200.N.0/24 with N in [lo, 254] that no interface of this host
// uses, for tests and benchmarks that need a private machine network beside a running kloud.
// Callers use different lo so their picks rarely meet.
func FreeSubnet(lo int) (netip.Prefix, error) {
	if lo < 0 || lo > 254 {
		return netip.Prefix{}, fmt.Errorf("free subnet: lo %d out of 0..254", lo)
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return netip.Prefix{}, err
	}
	for range 100 {
		n, _ := rand.Int(rand.Reader, big.NewInt(int64(255-lo)))
		p := netip.MustParsePrefix(fmt.Sprintf("10.200.%d.0/24", int64(lo)+n.Int64()))
		used := false
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(ipn.IP); ok && p.Contains(ip.Unmap()) {
					used = true
				}
			}
		}
		if !used {
			return p, nil
		}
	}
	return netip.Prefix{}, errors.New("no free 10.200.N.0/24")
}
