// Command terraformer serves Terraform runs to kloud over the kite protocol; see package
// terraformer.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/kloud-dev/kloud/internal/cgroups"
	"github.com/kloud-dev/kloud/internal/logfmt"
	"github.com/kloud-dev/kloud/internal/tlsconf"
	"github.com/kloud-dev/kloud/internal/version"
	"github.com/kloud-dev/kloud/terraformer"
	"github.com/kloud-dev/kloud/terraformer/tfsandbox"
)

func main() {
	tfsandbox.MaybeRun() // terraformer re-executes itself as the sandbox launcher of every terraform command
	var c terraformer.Config
	var users, readOnly string
	flag.StringVar(&c.Addr, "addr", terraformer.DefaultAddr, "address to listen on")
	flag.StringVar(&c.MetricsAddr, "metrics-addr", "", "also serve GET /metrics (Prometheus) without authentication on this address (on --addr it needs kloud's or its admin's kite key)")
	flag.StringVar(&c.DataDir, "data-dir", terraformer.DefaultDataDir(), "working directories, state and jobs (unless --shared-dir), and the kite id")
	flag.StringVar(&c.SharedDir, "shared-dir", "", "keep working directories, state, leases and jobs here instead of --data-dir: terraformers started with one --shared-dir are a pool kloud spreads work over (one host, or a shared filesystem with flock)")
	flag.StringVar(&c.KloudURL, "kloud-url", terraformer.DefaultKloudURL, "kloud's URL; callers' keys are verified with <url>/kite/keys")
	flag.StringVar(&users, "kloud-user", "kloud", "the only usernames allowed to call (comma-separated)")
	flag.StringVar(&c.TerraformPath, "terraform", "", "terraform binary (default: terraform on PATH, else $KLOUD_CACHE/bin/terraform)")
	flag.StringVar(&c.CLIConfigFile, "cli-config", terraformer.DefaultCLIConfig(), "Terraform CLI config with the offline provider mirror (from scripts/tf-mirror.sh)")
	flag.DurationVar(&c.HangTimeout, "hang-timeout", 0, "cancel a run whose terraform prints nothing for this long (default 10m)")
	flag.DurationVar(&c.CancelGrace, "cancel-grace", 0, "time between SIGINT and SIGKILL when a run is cancelled (default 10s)")
	flag.DurationVar(&c.LeaseTTL, "lease-ttl", 0, "lifetime of a content id's lease without renewal; a crashed terraformer's leases expire after it (default 30s)")
	flag.IntVar(&c.SandboxUID, "sandbox-uid", tfsandbox.DefaultUID, "user id terraform runs as in its sandbox (never 0)")
	flag.IntVar(&c.SandboxGID, "sandbox-gid", tfsandbox.DefaultGID, "group id terraform runs as in its sandbox (never 0)")
	flag.StringVar(&readOnly, "sandbox-read-only", "", "extra host paths terraform may read (comma-separated), besides the CLI config, its provider mirrors and the terraform binary")
	flag.BoolVar(&c.InsecureNoSandbox, "insecure-no-sandbox", false, "run terraform WITHOUT its sandbox, as terraformer's own user seeing the whole host: only for development without root")
	lim := tfsandbox.DefaultTerraformLimits
	flag.Float64Var(&lim.CPUs, "terraform-cpus", lim.CPUs, "CPUs each terraform command (terraform, its providers, what they start) may use, in its own cgroup (0: no limit)")
	memMB := flag.Int64("terraform-memory-mb", lim.MemoryBytes>>20, "memory limit in MiB of each terraform command's cgroup (0: no limit)")
	flag.IntVar(&lim.PidsMax, "terraform-pids-max", lim.PidsMax, "processes and threads limit of each terraform command's cgroup (0: no limit)")
	tlsCert := flag.String("tls-cert", "", "serve https/wss only, with this PEM certificate (chain); needs --tls-key")
	tlsKey := flag.String("tls-key", "", "the PEM private key of --tls-cert")
	caCert := flag.String("ca-cert", os.Getenv(tlsconf.EnvCACert), "PEM file of a CA to trust beside the system's for an https --kloud-url (env "+tlsconf.EnvCACert+")")
	logFormat := flag.String("log-format", logfmt.Text, logfmt.Usage)
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.Parse()
	if *showVersion {
		fmt.Println("terraformer", version.Version)
		return
	}
	lim.MemoryBytes = *memMB << 20
	if lim.CPUs < 0 || lim.MemoryBytes < 0 || lim.PidsMax < 0 {
		fmt.Fprintln(os.Stderr, "terraformer: --terraform-cpus, --terraform-memory-mb and --terraform-pids-max must not be negative")
		os.Exit(2)
	}
	if lim != (cgroups.Limits{}) && !c.InsecureNoSandbox {
		c.SandboxLimits = &lim
	}
	c.KloudUsers = strings.FieldsFunc(users, func(r rune) bool { return r == ',' || r == ' ' })
	c.SandboxReadOnly = strings.FieldsFunc(readOnly, func(r rune) bool { return r == ',' })
	if c.SandboxUID == 0 || c.SandboxGID == 0 {
		fmt.Fprintln(os.Stderr, "terraformer: --sandbox-uid and --sandbox-gid must not be 0: terraform never runs as root")
		os.Exit(2)
	}
	var err error
	if c.TLS, err = tlsconf.Server(*tlsCert, *tlsKey); err == nil {
		c.KloudTLS, err = tlsconf.Client(*caCert)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "terraformer:", err)
		os.Exit(2)
	}
	if c.Logger, err = logfmt.New(os.Stderr, *logFormat, slog.LevelInfo); err != nil {
		fmt.Fprintln(os.Stderr, "terraformer:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := terraformer.Run(ctx, c); err != nil {
		fmt.Fprintln(os.Stderr, err) // Run's errors start with "terraformer:"
		os.Exit(1)
	}
}
