package kite

import (
	"context"
	"net"
	"testing"
	"time"
)

// TestConnectTimedOut: a reconnecting client retries at once after a TCP connect that timed
// out (Options.ConnectTimeout: a SYN into a cut link), and backs off after one refused. The
// errors are real dials' (through the WebSocket and HTTP layers), not built by hand.
func TestConnectTimedOut(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String() + "/kite" // refused once the listener is gone
	ln.Close()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	for _, c := range []struct {
		name    string
		timeout time.Duration // Options.ConnectTimeout
		want    bool
	}{
		{"connect timeout passed", time.Nanosecond, true}, // the dialer's deadline is over before the SYN
		{"refused", 0, false},
	} {
		k, err := New(Options{Identity: Identity{Name: "dialer"}, ConnectTimeout: c.timeout})
		if err != nil {
			t.Fatal(err)
		}
		_, err = k.Dial(ctx, closed, Auth{})
		k.Close()
		if err == nil {
			t.Fatalf("%s: dial %s succeeded", c.name, closed)
		}
		if got := connectTimedOut(err); got != c.want {
			t.Errorf("%s: connectTimedOut(%v) = %v, want %v", c.name, err, got, c.want)
		}
	}
}
