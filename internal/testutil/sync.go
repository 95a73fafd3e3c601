package testutil

import (
	"bytes"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// SyncBuffer is a bytes.Buffer that a process or a goroutine writes while the test reads it.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Bytes returns a copy of what was written so far.
func (s *SyncBuffer) Bytes() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]byte(nil), s.b.Bytes()...)
}

// FreeLoopback returns a loopback address (127.0.0.1:port) whose port was free a moment ago.
// The port is below the kernel's ephemeral range (net.ipv4.ip_local_port_range): one in that
// range, as a listener on :0 gets, can be taken between this pick and the caller's bind by any
// outgoing connection on the host (ci59: a kloud's --terraformer-addr was, and its terraformer
// could not listen). Other tests pick from the same range at random; a clash is still possible
// but no longer with every connection the suite opens.
func FreeLoopback(t testing.TB) string {
	t.Helper()
	lo := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil && n > 12000 {
				lo = n
			}
		}
	}
	for range 100 {
		port := 10000 + rand.IntN(lo-10000)
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err == nil {
			ln.Close()
			return ln.Addr().String()
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
