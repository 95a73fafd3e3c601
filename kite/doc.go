// Package kite is Kloud's transport: JSON-RPC 2.0 over WebSocket between kites (kloud, kontrol,
// terraformer, klient and the browser), protocol v1 of docs/protocol.md.
//
// Start with Kite (New, Handle, ServeHTTP, Dial): one Kite both serves connections and dials
// other kites; on any established connection (Conn) either side may call and notify the other.
// A dialing side proves who it is with kite.handshake (Auth); the serving side checks it with an
// Authenticator (package kitekey has the JWT one). Client keeps a connection up with backoff and
// re-runs its registration hooks after every reconnect. Errors map to JSON-RPC codes in one
// place, errors.go. Conn reads and writes the JSON-RPC wire itself, one decode per frame and one
// encode per reply (stream.go; why not sourcegraph/jsonrpc2's Conn: docs/ARCHITECTURE.md §2),
// and gives each served call a context that costs nothing until used (callctx.go). The RPC core speaks a frame.Stream (package kite/frame: whole frames, no
// WebSocket types); package kite/wsframe adapts coder/websocket to it for ServeHTTP and Dial, and
// frame.Lines carries it over any byte stream, so the core is tested over net.Pipe
// (ServeFrames, DialFrames) as well as over real WebSockets. Example (example_test.go) is a
// server and a client call over loopback.
package kite
