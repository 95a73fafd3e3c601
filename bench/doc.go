// Package bench holds Kloud's performance measurements; results and the commands that produced
// them are in bench/RESULTS.md, and bench/run.sh (make bench) runs them all.
//
// For the spine (issue 2) start with the two programs: bench/cmd/p1 (package p1: a kite call
// round trip over loopback against a raw coder/websocket echo, in the same run) and
// bench/cmd/p2 (package p2: kontrol, inside a real `kloud serve` process, with 10,000
// simulated kites registered at once, against a raw WebSocket connect baseline). Each prints
// its figures, the baseline's and the ratios. kite_test.go has the P1 round trip as Go
// benchmarks, for `go test -bench` and its profilers.
package bench
