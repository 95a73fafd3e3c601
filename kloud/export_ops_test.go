package kloud

import "context"

// AppURL is the URL of port on machine id's app host of s ("" when apps are off), for the
// external tests (kloud/relay's Hub.AppURL).
func AppURL(s *Server, machineID string, port int) string { return s.relay.AppURL(machineID, port) }

// PollMetrics refreshes the machines' figures and the quota use of s once (the background task
// does it every Options.MetricsInterval; the external tests call it to not wait).
func PollMetrics(ctx context.Context, s *Server) { s.metrics.poller.Poll(ctx) }

// MaxEventStreams is maxEventStreams, for TestEventWatch.
const MaxEventStreams = maxEventStreams
