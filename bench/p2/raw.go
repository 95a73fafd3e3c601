package p2

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
)

// ServeRaw is the baseline server: a trivial coder/websocket echo (one goroutine per
// connection reading and writing back) on 127.0.0.1 at a free port. It prints
// "listening on ADDR" to out and serves until ctx ends. p2 runs it in a process of its own
// (bench/cmd/p2 -serve-raw) so that its memory can be measured alone.
func ServeRaw(ctx context.Context, out io.Writer) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("raw server: %w", err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		ctx := context.Background()
		for {
			typ, b, err := c.Read(ctx)
			if err != nil {
				return
			}
			if err := c.Write(ctx, typ, b); err != nil {
				return
			}
		}
	}), ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(out, "listening on %s\n", ln.Addr())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("raw server: %w", err)
	case <-ctx.Done():
	}
	srv.Close()
	return nil
}

// connectResult is the outcome of opening n connections with bounded concurrency.
type connectResult struct {
	ok, failed int
	firstErr   error
	wall       time.Duration   // first dial to last reply
	lat        []time.Duration // per connection: dial to reply, successes only
}

// fanOut runs do(i) for i in [0, n) on dialers goroutines and times each call and the whole.
func fanOut(ctx context.Context, n, dialers int, do func(ctx context.Context, i int) error) connectResult {
	var next atomic.Int64
	var mu sync.Mutex
	res := connectResult{lat: make([]time.Duration, 0, n)}
	start := time.Now()
	var wg sync.WaitGroup
	for range min(dialers, n) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				t0 := time.Now()
				err := do(ctx, i)
				d := time.Since(t0)
				mu.Lock()
				if err != nil {
					res.failed++
					if res.firstErr == nil {
						res.firstErr = err
					}
				} else {
					res.ok++
					res.lat = append(res.lat, d)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	res.wall = time.Since(start)
	return res
}

// rawConnect opens n WebSockets to the raw server, each with one echo round trip (as a
// registration has one reply), and keeps them open; close them with closeRaw.
func rawConnect(ctx context.Context, url string, n, dialers int) (connectResult, []*websocket.Conn) {
	conns := make([]*websocket.Conn, n)
	msg := []byte(`{"jsonrpc":"2.0","id":2,"method":"kontrol.register","params":{}}`)
	res := fanOut(ctx, n, dialers, func(ctx context.Context, i int) error {
		ctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		c, _, err := websocket.Dial(ctx, url, nil)
		if err != nil {
			return fmt.Errorf("raw dial: %w", err)
		}
		if err := c.Write(ctx, websocket.MessageText, msg); err != nil {
			c.CloseNow()
			return fmt.Errorf("raw write: %w", err)
		}
		if _, _, err := c.Read(ctx); err != nil {
			c.CloseNow()
			return fmt.Errorf("raw read: %w", err)
		}
		conns[i] = c
		return nil
	})
	return res, conns
}

func closeRaw(conns []*websocket.Conn) {
	for _, c := range conns {
		if c != nil {
			c.CloseNow()
		}
	}
}

var errNotOne = errors.New("query by id did not return exactly that kite")
