package docker_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/docker"
	"github.com/kloud-dev/kloud/providers/docker/dockertest"
)

// The docker provider's constraints are its daemon's CPUs and memory; its stack refuses a
// container asking for more, with the nearest valid value.
func TestConstraintsOfTheDaemon(t *testing.T) {
	t.Parallel()
	dd := dockertest.New(t)
	d, err := docker.New(docker.Options{Host: dd.Host, Image: dd.Image, StateDir: t.TempDir(), Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	p := d.Provider()
	if !p.Can(provider.CapConstraints) {
		t.Fatalf("capabilities %v", p.Caps())
	}
	vocab := provider.Describe(p).Constraints
	if err := provider.CheckVocabulary(vocab); err != nil {
		t.Fatal(err)
	}
	cores, mem := provider.LookupConstraint(vocab, provider.ConstraintCores), provider.LookupConstraint(vocab, provider.ConstraintMem)
	if cores == nil || cores.Max == nil || *cores.Max < 1 || mem == nil || mem.Max == nil || *mem.Max < 64 || provider.LookupConstraint(vocab, provider.ConstraintArch) == nil {
		t.Fatalf("vocabulary %+v: want cores and mem bounded by the daemon, and its arch", vocab)
	}
	st, err := p.Stack(&provider.BaseStack{Provider: p})
	if err != nil {
		t.Fatal(err)
	}
	cv := st.(provider.ConstraintsValidator)
	// docker_container's cpus is a string in Terraform.
	if err := cv.ValidateConstraints(t.Context(), map[string]any{"memory": 256.0, "cpus": "0.5", "hostname": "x"}); err != nil {
		t.Errorf("a container the daemon can run: %v", err)
	}
	err = cv.ValidateConstraints(t.Context(), map[string]any{"memory": *mem.Max * 2})
	var ce *provider.ConstraintError
	if !errors.As(err, &ce) || ce.Attribute != "memory" || !strings.Contains(err.Error(), "the Docker daemon allows") || ce.Nearest != int64(*mem.Max) {
		t.Fatalf("twice the daemon's memory: %v (%+v)", err, ce)
	}
	t.Log(err)
}
