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
//
// The pick is reserved until release is called (or the process ends): no other FreeSubnet on this
// host returns it meanwhile, also between the pick and the moment its bridge gets its address.
// Without that, two tests starting at once could pick the same subnet; the host then routed one
// bridge's replies onto the other and its machines could not reach their kloud. The reservation
// is an abstract Unix socket named after the subnet: the kernel gives a name to one socket at a
// time, forgets it when the socket closes or its process dies, and leaves no file.
func FreeSubnet(lo int) (p netip.Prefix, release func(), err error) {
	if lo < 0 || lo > 254 {
		return netip.Prefix{}, nil, fmt.Errorf("free subnet: lo %d out of 0..254", lo)
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return netip.Prefix{}, nil, err
	}
	for range 200 {
		n, _ := rand.Int(rand.Reader, big.NewInt(int64(255-lo)))
		p := netip.MustParsePrefix(fmt.Sprintf("10.200.%d.0/24", int64(lo)+n.Int64()))
		if subnetInUse(p, addrs) {
			continue
		}
		l, err := net.Listen("unix", "@kloud-subnet-"+p.Addr().String())
		if err != nil {
			continue // reserved by another caller
		}
		return p, func() { l.Close() }, nil
	}
	return netip.Prefix{}, nil, errors.New("no free 10.200.N.0/24")
}

// subnetInUse says whether an address of addrs lies in p.
func subnetInUse(p netip.Prefix, addrs []net.Addr) bool {
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(ipn.IP); ok && p.Contains(ip.Unmap()) {
				return true
			}
		}
	}
	return false
}
