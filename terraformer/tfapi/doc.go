// Package tfapi is what kloud and terraformer exchange, apart from the engine: the method names
// and params of terraformer.plan, apply, destroy, job, watch, cancel, state and outputs
// (Request, JobParams, ContentParams, ...), the jobs, events and results they answer with (Job,
// Event, Result), and /healthz and /readyz's bodies. It links nothing of the module: not
// terraform-exec, not the engine (terraformer/tfrun, which names these types too), not kite.
// kloud imports it and terraformer/tfclient (the client) only.
//
// Start reading at [Request] (api.go), [Job] and [Event] (job.go). The protocol itself is
// described in package terraformer's doc.
package tfapi
