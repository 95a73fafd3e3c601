// Package chaos is Kloud's fault suite (issue 23, docs/RELIABILITY.md "Fault suite"): it starts
// real kloud, terraformer and klient processes with the local provider, kills one of them with
// SIGKILL at a random moment of an operation, restarts it (or lets kloud's supervisor or the
// machine's restart loop do it), follows the operation to its end and checks the invariants
// (no job stuck, no lease held past expiry, store and terraform state agree, nothing on the host
// that no stack owns), repeated CHAOS_N times per scenario with a seeded random kill point.
//
// The package holds only tests. Start reading at scenarios_test.go (TestChaos: the scenarios and
// the table of outcomes they print), then world_test.go (one kloud installation: its processes,
// the CLI, kills and restarts) and invariants_test.go (the checks every run ends with).
//
// Settings (environment): CHAOS_N runs per scenario (default 1: the short version `make test`
// runs; `make chaos` sets 20), CHAOS_SEED the seed (default: the time; printed, so a run can be
// repeated), CHAOS_REPORT a file the Markdown table is written to, CHAOS_SLACK the slack added
// to the resumption target of 3 s on a loaded host (default 2s). It needs root (local machines);
// without it the tests skip loudly, under CI=true they fail.
package chaos
