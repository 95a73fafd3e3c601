// Package tfrun is terraformer's engine: it runs the real Terraform CLI (plan, apply, destroy) for
// content ids, one working directory and one lease per content id, and keeps jobs, progress and
// state on disk so that a result outlives the caller and the process. It has no RPC; the kite layer
// (package terraformer) sits on top.
//
// Start reading at [New] and [Engine.Submit]; a run's life is in run.go, the terraform commands
// (through github.com/hashicorp/terraform-exec, with the sandbox launcher as the executable) in
// exec.go, and the lease in lease.go.
//
// # The sandbox
//
// Every terraform command (version, init, plan, apply, destroy, show) runs through the launcher of
// package terraformer/tfsandbox: unprivileged (Options.SandboxUID/GID, default 65534), with no
// capabilities, in its own pid and mount namespaces where only the run's work dir (read-write),
// the variables file, the terraform binary, the CLI config and its provider mirrors (read-only),
// /usr, /etc and the like (read-only) and a private /tmp exist. Whatever terraform starts dies
// with the command. The program that calls New is the launcher unless Options.Launcher says
// otherwise, so its main (or TestMain) must call tfsandbox.MaybeRun() first. New fails without
// root unless Options.InsecureNoSandbox (development only). terraform's environment is only
// PATH, locale, TZ, proxy and CA settings of this process plus TF_CLI_CONFIG_FILE.
//
// The work dir and the variables file are chowned to the sandbox user before each run (the
// variables file stays 0600: only that user, and root, read the credentials in it); terraformer
// reads plans through `terraform show`, and states from the state file itself (statefile.go:
// show would start every provider again), with `terraform show` as the fallback.
//
// # Layout under Options.Dir
//
//	stacks/<contentID>/work/            Terraform working directory: the content files (*.tf,
//	                                    *.tf.json), terraform.tfstate (local backend), .terraform/
//	stacks/<contentID>/work/.kloud-plan.out  the last saved plan
//	stacks/<contentID>/variables.json   the variables of the last request (passed as -var-file;
//	                                    0600, owned by the sandbox user, read-only in the sandbox)
//	stacks/<contentID>/state.json       the state after the last run as `terraform show -json`
//	                                    prints it
//	stacks/<contentID>/init.sum         what the last successful `terraform init` saw (content,
//	                                    CLI config, mirror, terraform version): init is skipped
//	                                    while it still matches
//	stacks/<contentID>/lease.json       the lease: owner, job, expiry (replaced with rename, under
//	stacks/<contentID>/lease.lock       an flock on this file)
//	jobs/<jobID>.json                   one job: status, progress, log tail, error, result
//	jobs/<jobID>.log                    everything Terraform printed for that job
//	pool-id                             the directory's random id (Engine.PoolID), written once
//
// Several engines, of several processes, may share one Dir (terraformer's --shared-dir: a pool):
// the lease's flock and rename keep two runs of one content id apart, Watch follows a job that
// another process runs by polling its job file, and the reaper marks a job failed
// (KindRestarted) only once its process is gone (its pid on this host) or its lease has expired
// (another host). Their options that shape a run (terraform, CLI config, sandbox uid/gid) must be
// the same.
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
// Cancelling a job (Cancel, the hang detector, Close) makes terraform-exec send SIGINT to the
// launcher, which passes it on to terraform, which stops its providers and provisioners and writes
// the state. If terraform has not exited after Options.CancelGrace (terraform-exec's WaitDelay),
// the launcher gets SIGKILL, and with it everything in terraform's pid namespace. Close with an
// expired context kills at once. If terraformer itself dies, the kernel kills the launcher
// (Pdeathsig) and so everything terraform started: no orphaned providers or provisioners.
package tfrun
