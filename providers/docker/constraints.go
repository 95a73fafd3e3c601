package docker

import (
	"context"
	"strings"
	"time"

	"github.com/moby/moby/client"

	"github.com/kloud-dev/kloud/provider"
)

// Constraints of docker machines, from the daemon's own figures (docker info), checked at plan
// time and enforced by the daemon's cgroups:
//
//	cores  cpus    number   0.1 up to the daemon's CPUs (docker_container's cpus, a string; below
//	                        0.1 the Docker Terraform provider reads every value back as another:
//	                        drift.go)
//	mem    memory  integer  6 MB (Docker's minimum) up to the daemon's memory
//	arch   -       the daemon's (machines share its kernel)

// Constraints returns the docker provider's vocabulary; the upper bounds are missing when the
// daemon does not answer (within 5 seconds).
func (d *Docker) Constraints() []provider.Constraint {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return d.constraints(ctx)
}

func (d *Docker) constraints(ctx context.Context) []provider.Constraint {
	vocab := []provider.Constraint{
		{Name: provider.ConstraintCores, Attribute: "cpus", Type: provider.ConstraintNumber, Unit: "CPUs",
			Min: provider.Bounds(0.1), Bound: "the Docker daemon",
			Description: "CPU limit (cgroup quota); unset: unlimited"},
		{Name: provider.ConstraintMem, Attribute: "memory", Type: provider.ConstraintInteger, Unit: "MB",
			Min: provider.Bounds(6), Bound: "the Docker daemon",
			Description: "memory limit in MB (cgroup); unset: unlimited"},
	}
	cli, err := d.Client()
	if err == nil {
		var res client.SystemInfoResult
		if res, err = cli.Info(ctx, client.InfoOptions{}); err == nil {
			in := res.Info
			if in.NCPU > 0 {
				vocab[0].Max = provider.Bounds(float64(in.NCPU))
			}
			if in.MemTotal > 0 {
				vocab[1].Max = provider.Bounds(float64(in.MemTotal >> 20))
			}
			if arch := goArch(in.Architecture); arch != "" {
				vocab = append(vocab, provider.Constraint{Name: provider.ConstraintArch, Type: provider.ConstraintString, Values: []string{arch},
					Description: "the daemon's architecture (machines share its kernel)"})
			}
		}
	}
	if err != nil {
		d.log.Warn("docker provider: daemon info unavailable; cpus and memory are not bounded above", "err", err)
	}
	return vocab
}

// goArch names the daemon's architecture (uname -m) as Go and Juju do.
func goArch(m string) string {
	switch strings.ToLower(m) {
	case "x86_64", "amd64":
		return "amd64"
	case "aarch64", "arm64":
		return "arm64"
	case "":
		return ""
	}
	return strings.ToLower(m)
}

// ValidateConstraints checks a docker_container's planned attributes against the daemon.
func (s *stack) ValidateConstraints(ctx context.Context, attrs map[string]any) error {
	return provider.ValidateConstraints(s.d.constraints(ctx), attrs)
}

var _ provider.ConstraintsValidator = (*stack)(nil)
