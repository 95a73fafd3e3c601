package cli

import (
	"net"
	"testing"
	"time"
)

// TestTerraformerAddrWaitsForAKilledOnesPort: the --terraformer-addr a terraformer of a killed
// kloud still holds (it is stopping) is waited for, and used once it is free; an address that
// stays taken is given up after the bound, for the start to report the listener's error.
func TestTerraformerAddrWaitsForAKilledOnesPort(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	go func() { time.Sleep(300 * time.Millisecond); ln.Close() }()
	start := time.Now()
	got, err := terraformerAddr(addr)
	if err != nil || got != addr {
		t.Fatalf("terraformerAddr(%s) = %s, %v", addr, got, err)
	}
	if time.Since(start) < 250*time.Millisecond {
		t.Errorf("terraformerAddr returned after %v, before the port was free", time.Since(start))
	}
	again, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("the address is not free once terraformerAddr returned: %v", err)
	}
	defer again.Close()
	start = time.Now()
	waitFree(addr, 200*time.Millisecond) // stays taken: gives up
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("waitFree on a taken address took %v, bound 200ms", d)
	}
}
