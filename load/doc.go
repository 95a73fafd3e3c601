// Package load is Kloud's load suite (issue 23, "Load suite"): bounded, loopback-only load
// against a real `kloud serve` process (its real store and terraformer, dummy machines that
// are real klient processes), printing the figures as Markdown rows for docs/RELIABILITY.md.
//
// Start reading at load_test.go (sizes, the kloud process, the figures), then one file per
// scenario: api_test.go (concurrent API clients, p50/p99 per method), applies_test.go
// (concurrent stack applies, no lost job), terminals_test.go (concurrent terminals through
// kloud's relay, per-terminal throughput and memory) and reregister_test.go (kloud SIGKILLed
// with simulated agents connected: time until all registered again).
//
// `make load` runs the full sizes (LOAD=full); `go test ./load` (and so `make test`) runs a
// tiny version of each in seconds so the suite cannot rot. Sizes can be set one by one:
// LOAD_CLIENTS, LOAD_DURATION, LOAD_APPLIES, LOAD_TERMINALS, LOAD_AGENTS.
package load
