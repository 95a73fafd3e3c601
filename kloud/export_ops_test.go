package kloud

import (
	"context"
	"time"
)

// AppURL is the URL of port on machine id's app host of s ("" when apps are off), for the
// external tests (kloud/relay's Hub.AppURL).
func AppURL(s *Server, machineID string, port int) string { return s.relay.AppURL(machineID, port) }

// PollMetrics refreshes the machines' figures and the quota use of s once (the background task
// does it every Options.MetricsInterval; the external tests call it to not wait).
func PollMetrics(ctx context.Context, s *Server) { s.metrics.poller.Poll(ctx) }

// MaxEventStreams is maxEventStreams, for TestEventWatch.
const MaxEventStreams = maxEventStreams

// Sweep runs fn as s's pass name under its sweep lease (sweeps.go), as the reconciler, the
// retention prune and the gc sweep run: an error wrapping kite.ErrConflict when another replica's
// pass of that name runs.
func Sweep(ctx context.Context, s *Server, name string, fn func(ctx context.Context) error) error {
	return s.sweeps().run(ctx, name, fn)
}

// SetMachineInfoWait sets how long machine.info waits for the provider's Info (default 20s),
// before s serves calls.
func SetMachineInfoWait(s *Server, d time.Duration) { s.machines.infoWait = d }
