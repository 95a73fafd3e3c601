// Package terraformer is Terraform as a kite service: the methods terraformer.plan, apply,
// destroy, job, watch, cancel, state and outputs on a kite named "terraformer", served to kloud
// only, on top of the engine in terraformer/tfrun (which runs the real terraform CLI and keeps
// jobs, leases and state on disk, in one directory that several terraformer processes may share:
// see "A pool" below). Its wire types are terraformer/tfapi and the client kloud
// uses terraformer/tfclient (both named here too); this package also holds the process
// that cmd/terraformer runs (Run).
//
// Start reading at [New] (the service and its methods, service.go) and [Request] (the params of
// plan/apply/destroy, api.go); then [NewClient] and [Client.Wait] (client.go); [Run] (run.go)
// wires a process together; [NewAuthenticator] (auth.go) is how the service checks credentials.
//
// # A pool
//
// Terraformers started with one --shared-dir (Config.SharedDir) keep every stack's work dir,
// state, stored files and variables, its lease, and every job in that directory, and only their
// kite id in their own --data-dir: they are a pool that kloud spreads work over (package
// terraformer/tfpool; kloud serve --terraformers N, or --terraformer-url given several times).
// Any member answers terraformer.job, watch, state and outputs for any job and stack (a job that
// another process runs is followed by its job file); the stack's lease keeps two runs of one
// stack apart across processes (-32004 to the second); a job whose process died is marked failed
// with kind "restarted" by the member that reads it (at once on the same host, after the lease
// TTL on another), and kloud runs it again on a live member. /healthz reports the directory's
// poolId (Dir/pool-id, made by the first engine), so that a pool can refuse a member of another
// directory. docs/deployment.md, "A pool of terraformers", is the operator's view.
//
// # Terraform's sandbox
//
// Every terraform command runs through package terraformer/tfsandbox (cmd/terraformer's main
// calls tfsandbox.MaybeRun first: terraformer re-executes itself as the launcher): as uid/gid
// 65534 (--sandbox-uid, --sandbox-gid), without capabilities, in its own pid and mount
// namespaces that hold only its work dir, the provider mirror and the system directories
// (/usr, /etc, ...; --sandbox-read-only adds paths). Whatever terraform starts dies with the run,
// also when terraformer is killed. This needs root: without it terraformer refuses to start,
// unless --insecure-no-sandbox is given, which runs terraform as terraformer's own user seeing the
// whole host, for development without root only.
//
// # Who may call
//
// The kite's Authenticator verifies kite keys and tokens against kontrol's public keys, fetched
// from kloud's GET /kite/keys and cached (an unknown kid refetches, so a rotation is followed): a
// bad, forged or expired credential fails the handshake with -32001. Every terraformer.* method
// then requires that the credential is a kite key, or a token for this kite's id, whose subject
// is one of Options.KloudUsers (default "kloud"); anyone else gets -32002.
//
// # Methods
//
//	terraformer.plan|apply|destroy  Request                → SubmitResult {jobId}, at once
//	terraformer.job                 JobParams {jobId}      → tfrun.Job
//	terraformer.watch               JobParams {jobId}      → WatchResult {subscription}, then
//	                                                         terraformer.event notifications
//	terraformer.cancel              JobParams {jobId}      → tfrun.Job (after it stopped)
//	terraformer.state               ContentParams          → StateResult {contentId, state}
//	terraformer.outputs             ContentParams          → OutputsResult {contentId, outputs}
//
// A plan/apply/destroy on a content id that another job holds fails with -32004 (the message
// names the holder); an unknown job or content id is -32003; malformed params are -32602;
// cancelling a finished job, or submitting while terraformer shuts down, is -32005.
//
// A job keeps running when its caller disconnects, and the engine persists it, so its result can
// be read with terraformer.job later, also after a terraformer restart.
//
// # Events
//
// terraformer.event notifications carry a tfrun.Event as data: first a snapshot of the job
// ("job"), then "progress" (one resource), "log" (one line of Terraform output), "diagnostic" and
// "status" events, and finally "final" with the finished job. The stream then ends; if the job did
// not succeed, the end carries an error whose data.details is the job's tfrun.JobError (kind,
// message, Terraform's diagnostics) and whose code says how it ended: -32006 for a cancelled
// (data.type "cancelled") or hung (data.type "timeout") job, -32005 for any other failure.
package terraformer
