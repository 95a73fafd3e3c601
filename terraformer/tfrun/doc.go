// Package tfrun is terraformer's engine: it runs the real Terraform CLI (plan, apply, destroy) for
// content ids, one working directory and one lease per content id, and keeps jobs, progress and
// state on disk so that a result outlives the caller and the process. It has no RPC; the kite layer
// (package terraformer) sits on top.
//
// Start reading at [New] and [Engine.Submit]; a run's life is in run.go, the subprocess handling
// (SIGINT, then SIGKILL of the whole process group after a grace period) in exec.go, and the lease
// in lease.go.
//
// # Layout under Options.Dir
//
//	stacks/<contentID>/work/            Terraform working directory: the content files (*.tf,
//	                                    *.tf.json), terraform.tfstate (local backend), .terraform/
//	stacks/<contentID>/variables.json   the variables of the last request (passed as -var-file)
//	stacks/<contentID>/state.json       `terraform show -json` of the state after the last run
//	stacks/<contentID>/plan.out         the last saved plan
//	stacks/<contentID>/init.sum         what the last successful `terraform init` saw (content,
//	                                    CLI config, mirror, terraform version): init is skipped
//	                                    while it still matches
//	stacks/<contentID>/lease.json       the lease: owner, job, expiry (replaced with rename, under
//	stacks/<contentID>/lease.lock       an flock on this file)
//	jobs/<jobID>.json                   one job: status, progress, log tail, error, result
//	jobs/<jobID>.log                    everything Terraform printed for that job
//
// # Providers and the plugin cache
//
// Terraform is run with TF_CLI_CONFIG_FILE = Options.CLIConfigFile, which is expected to install
// providers from a filesystem mirror (scripts/tf-mirror.sh writes one). For an unpacked mirror,
// `terraform init` symlinks the provider directory into .terraform/providers instead of copying
// it, so a plugin cache would save nothing. TF_PLUGIN_CACHE_DIR is removed from Terraform's
// environment on purpose: the cache is not safe for concurrent `terraform init` runs, and runs on
// different content ids do run in parallel.
//
// # Cancellation
//
// Cancelling a job (Cancel, the hang detector, Close) sends SIGINT to terraform, which stops its
// providers and provisioners and writes the state. If terraform has not exited after
// Options.CancelGrace, its whole process group gets SIGKILL.
package tfrun
