// Package tfapi is what kloud and terraformer exchange, apart from the engine: the method names
// and params of terraformer.plan, apply, destroy, job, watch, cancel, state and outputs
// (Request, JobParams, ContentParams, ...), the jobs, events and results they answer with (Job,
// Event, Result), /healthz and /readyz's bodies, and the typed client kloud calls terraformer with
// (Client). It links neither terraform-exec nor the engine (terraformer/tfrun, which names these
// types too) nor the service (package terraformer): kloud imports this package only.
//
// Start reading at [Request] (api.go), [Job] and [Event] (job.go), then [NewClient] and
// [Client.Wait] (client.go). The protocol itself is described in package terraformer's doc.
package tfapi
