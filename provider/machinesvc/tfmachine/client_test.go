package tfmachine

import (
	"errors"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

// A kloud that is restarting refuses connections for a moment: the client waits for it instead
// of failing the terraform run at once, and sends the token.
func TestClientRetriesRefusedConnections(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens: connections are refused
	c, err := NewClient[struct{}, struct{}](testService, "http://"+addr, "tok")
	if err != nil {
		t.Fatal(err)
	}
	var auth atomic.Value
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth.Store(r.Header.Get("Authorization"))
		w.WriteHeader(http.StatusNotFound)
		w.Write([]byte(`{"error": "machine m1 does not exist"}`))
	})}
	t.Cleanup(func() { srv.Close() })
	go func() {
		time.Sleep(time.Second)
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Error(err)
			return
		}
		srv.Serve(ln)
	}()
	t0 := time.Now()
	_, err = c.Read(t.Context(), "m1")
	if !errors.Is(err, errNotFound) || auth.Load() != "Bearer tok" {
		t.Fatalf("read: %v (authorization %v)", err, auth.Load())
	}
	if d := time.Since(t0); d < 900*time.Millisecond {
		t.Errorf("answered after %s, before kloud listened", d)
	}
	for _, bad := range []string{"ftp://x", "http://", "http://u:p@h:1", "http://h:1/?q=1"} {
		if _, err := NewClient[struct{}, struct{}](testService, bad, "tok"); err == nil {
			t.Errorf("NewClient(%q) accepted", bad)
		}
	}
	if _, err := NewClient[struct{}, struct{}](testService, "http://127.0.0.1:1", ""); err == nil {
		t.Error("NewClient without a token accepted")
	}
}

var (
	errNotFound = errors.New("kloudtest: machine not found")
	testService = Service{Kind: "test", APIPath: "/provider/test/v1/", Timeout: time.Minute, NotFound: errNotFound}
)
