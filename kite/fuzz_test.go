package kite_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/kite"
	kiteframe "github.com/kloud-dev/kloud/kite/frame"
)

// FuzzFrame checks the property the frame screening exists for: no frame a peer sends, before or
// after the handshake, can break the connection. After the fuzzed frame, a ping must still be
// answered.
func FuzzFrame(f *testing.F) {
	for _, s := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"kite.ping"}`,
		`{"jsonrpc":"2.0","id":1,"method":"kite.handshake","params":{"kite":{"name":"x"},"auth":{"type":"kiteKey","key":"user:a"}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"kite.handshake","params":{"kite":{"name":"a/b"},"auth":{"type":"token","key":""}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"kite.handshake","params":[{"kite":{},"auth":{}}]}`,
		`{"jsonrpc":"2.0","id":null,"result":1}`,
		`{"jsonrpc":"2.0","id":"x","error":{"code":1,"message":"m"}}`,
		`{"jsonrpc":"2.0","method":"kite.cancel","params":{"id":1}}`,
		`{"jsonrpc":"2.0","method":"kite.unsubscribe","params":{"subscription":1}}`,
		`[]`, `{}`, `null`, `"`, `{"jsonrpc":"2.0","id":1e400,"method":"m"}`,
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, frame []byte, afterHandshake bool) {
		if bytes.ContainsAny(frame, "\r\n") {
			t.Skip()
		}
		sk, err := kite.New(kite.Options{Identity: kite.Identity{Name: "fuzz"}, Authenticator: userAuth, PingInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		defer sk.Close()
		a, b := net.Pipe()
		defer b.Close()
		sk.ServeFrames(kiteframe.Lines(a, 1<<20), "fuzz")
		b.SetDeadline(time.Now().Add(5 * time.Second))
		// net.Pipe has no buffer: read in the background so the server never blocks writing.
		lines := make(chan []byte, 64)
		go func() {
			defer close(lines)
			r := bufio.NewReader(b)
			for {
				line, err := r.ReadBytes('\n')
				if err != nil {
					return
				}
				lines <- line
			}
		}()
		send := func(s []byte) {
			if _, err := b.Write(append(append([]byte{}, s...), '\n')); err != nil {
				t.Fatalf("write: %v", err)
			}
		}
		waitFor := func(id string) map[string]any {
			for {
				line, ok := <-lines
				if !ok {
					t.Fatalf("connection broke after frame %q", frame)
				}
				var m map[string]any
				if json.Unmarshal(line, &m) != nil {
					t.Fatalf("server sent invalid JSON %q", line)
				}
				if m["id"] == id {
					return m
				}
			}
		}
		if afterHandshake {
			send([]byte(`{"jsonrpc":"2.0","id":"hs","method":"kite.handshake","params":{"kite":{"name":"f"},"auth":{"type":"kiteKey","key":"user:f"}}}`))
			waitFor("hs")
		}
		send(frame)
		send([]byte(`{"jsonrpc":"2.0","id":"probe","method":"kite.ping"}`))
		if m := waitFor("probe"); m["result"] != "pong" {
			t.Fatalf("after frame %q: %v", frame, m)
		}
	})
}
