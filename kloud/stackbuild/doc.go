// Package stackbuild is the stack build flow: the stack.apply job (build and destroy), the
// stack.update job (update, scale, and stack.plan of a stack, its preview), the reconciler, the
// machines' agent keys, and the facts kloud's other job code (kloud/machines.go) follows, one
// place each. It sits apart from kloud as coder's wsbuilder sits apart from coderd:
// kloud's handlers check who and what, call a Flow, and answer; a Flow gets everything it needs
// of kloud through Deps (flow.go: the store's repositories, a Terraformer client, the provider
// registry, kontrol, and kloud's checks as small interfaces defined here), and the package never
// imports kloud (a test in kloud enforces it). Start reading at flow.go, then stages.go.
//
//   - flow.go: Deps, Flow, and the bookkeeping every job shares (SetStack, SetMachine, StopTF,
//     SubmitTF).
//   - build.go: the stack.apply job (RunApply): Resume, the build, ExitStack, and the settle
//     steps build and update share (WaitAgents, SettleMachines, SettleStack).
//   - destroy.go: the destroy half of stack.apply (Destroy).
//   - buckets.go: the stacks' bucket claims (ProvisionBuckets, DeleteBuckets, DeleteBucket).
//   - leases.go: the store leases "stack/<id>" and "machine/<id>" (TakeLease, RetakeLease,
//     KeepLease): one job, or one call that must not overlap a job, at a time on each.
//   - mint.go: every machine's agent key and configuration (Mint), kept sealed on its record
//     so that an update renders a machine that stays with the agent it was built with.
//   - update.go: how an update works, its params (UpdateParams), and what the calls use:
//     CheckUpdate (stack.update and stack.scale refuse before a job), PreviewUpdate
//     (stack.plan of a stack), FailedUpdate (stack.apply converges a stack a failed update
//     left as an update); update_job.go runs the job (RunUpdate); update_diff.go says per
//     machine what an update does.
//   - reconcile.go: the reconciler (Reconcile, ReconcileForApply; JobVerdict and MachineDead),
//     and stack.reset's forced way out of any state (Reset).
//   - scale.go: stack.scale's rewrite of a stack's files (ScaleFiles); the update job applies
//     them.
//   - stages.go: the named progress stages of build, destroy, start and stop, with their
//     percentages and the state each names; jobs report progress only through them.
//   - params.go: the typed parameters of a stack.apply job (ApplyParams), as its job document
//     stores them.
//   - planner.go: after Terraform created the machines, the Planner waits for each machine's
//     agent to register with kontrol, answer kite.ping and finish provisioning, and when an
//     agent never comes it names the provisioning step that failed (ParseBootFailure reads a
//     machine's console for that). It was moved here from provider/ so that the provider
//     contract links neither kite nor klient (a test in provider/ enforces that): kloud passes
//     the planner an Agents implementation over its kontrol. How long it waits is one setting,
//     kloud.Options.AgentTimeout.
//
// # The build flow
//
// stack.apply (kloud/stacks.go) takes the stack's lease, reconciles what a dead job left, moves
// the stack to Building (or Destroying) with the new job's id in one update, and starts the job
// with ApplyParams. The job, for a build:
//
//  1. BuildChecking: machines to Building (from settled states only).
//  2. BuildCredentials: the template is parsed once, checked against the template policy,
//     given its credentials' variables; the parsed config (provider.Template.Config) is handed
//     on, so nothing parses it again unless a provider changes the files behind it.
//  3. BuildUserData: every machine's agent key is minted and its kite id recorded first (one
//     store write, Machines.SetKiteIDs); then each provider's ApplyTemplate renders the ready
//     agent configurations into the template (BaseStack.AgentConfig is a lookup that writes
//     nothing).
//  4. BuildBuckets (only when the template declares kloud_bucket claims, or the stack has
//     claims the template no longer declares, which end): each claim recorded, provisioned by
//     its provider's BucketProvisioner and marked ready (buckets.go), before Terraform runs;
//     the template build took the blocks out of what Terraform sees. An update does the same.
//  5. BuildResources: terraform apply (its run id recorded on the stack, for recovery).
//  6. BuildAgents: the Planner waits for the agents.
//  7. BuildSettings, BuildDone: machines' states, attributes and agent status written.
//
// A destroy ends the stack's bucket claims after terraform destroyed its machines and their
// keys are revoked (DestroyBuckets: deleted, or kept with retain), before the stack's record
// goes: a destroy that failed there runs again and finishes them.
//
// # Guards
//
// Four mechanisms touch one stack; the store lease is THE guard that only one job works on a
// stack:
//
//   - The store lease "stack/<id>" (store.AcquireLease): taken by stack.apply before anything
//     changes, renewed by the job while it runs, taken again under the same owner name
//     (ApplyParams.Lease) when a restarted kloud recovers the job, and looked at by the
//     reconciler and stack.reset, which leave a stack alone while its lease is live.
//   - The state transition (stack to Building/Destroying with jobId, from the states an apply
//     may start in) is not a lock but the record of who owns the transitional state: every
//     later write of the job is conditional on it (TransitionOfJob), and the reconciler moves a
//     stack whose job is over out of it.
//   - The job runner lease (store.Jobs) says which kloud runs the job, not which stack it is
//     on; it is what hands a dead kloud's job to a live one.
//   - Terraformer's lease on a content id ("stack-<id>") keeps two terraform runs off one
//     working directory: a run of an earlier attempt may still go on after kloud restarted
//     (submitTF waits for it).
//
// None is redundant: each covers a failure the others do not (a second caller, a dead job's
// state, a dead kloud, a terraform run that outlived its kloud), so all four stay.
package stackbuild
