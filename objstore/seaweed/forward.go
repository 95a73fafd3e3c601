package seaweed

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
)

// forwarder is an isolated Server's S3 address on the host (Options.Isolate): it accepts on
// S3IP:S3Port and joins each connection, byte for byte, to weed's S3 unix socket under Dir (the
// gateway checks every request's signature, Host header included, as if it were reached directly).
type forwarder struct {
	ln    net.Listener
	sock  string
	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// listen starts s's forwarder once; a restarted weed makes its socket again at the same path.
func (s *Server) listen() error {
	if s.fwd != nil {
		return nil
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(s.o.S3IP, strconv.Itoa(s.ports.S3)))
	if err != nil {
		return fmt.Errorf("seaweed: the S3 address: %w", err)
	}
	f := &forwarder{ln: ln, sock: s.o.path("s3.sock"), conns: map[net.Conn]struct{}{}}
	s.fwd = f
	f.wg.Add(1)
	go f.accept()
	return nil
}

func (f *forwarder) accept() {
	defer f.wg.Done()
	for {
		c, err := f.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		f.wg.Add(1)
		go f.join(c)
	}
}

// join copies between c and a new connection to weed's socket until either side ends.
func (f *forwarder) join(c net.Conn) {
	defer f.wg.Done()
	u, err := net.Dial("unix", f.sock)
	if err != nil {
		c.Close()
		return
	}
	if !f.track(c, u) {
		return
	}
	defer f.untrack(c, u)
	done := make(chan struct{})
	go func() {
		io.Copy(u, c)
		u.(*net.UnixConn).CloseWrite()
		close(done)
	}()
	io.Copy(c, u)
	if tc, ok := c.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
	<-done
}

func (f *forwarder) track(cs ...net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.conns == nil { // closed
		for _, c := range cs {
			c.Close()
		}
		return false
	}
	for _, c := range cs {
		f.conns[c] = struct{}{}
	}
	return true
}

func (f *forwarder) untrack(cs ...net.Conn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range cs {
		c.Close()
		delete(f.conns, c)
	}
}

// closeForwarder stops accepting, ends every joined connection and waits.
func (s *Server) closeForwarder() {
	f := s.fwd
	if f == nil {
		return
	}
	s.fwd = nil
	f.ln.Close()
	f.mu.Lock()
	for c := range f.conns {
		c.Close()
	}
	f.conns = nil
	f.mu.Unlock()
	f.wg.Wait()
}
