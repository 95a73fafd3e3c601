package local_test

import (
	"errors"
	"runtime"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/local"
)

// The local provider's vocabulary is this host's: cores up to its CPUs, mem up to its memory;
// its stack validates planned attributes against it.
func TestConstraintsOfThisHost(t *testing.T) {
	l, err := local.New(local.Options{StateDir: t.TempDir(), Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	p := l.Provider()
	if !p.Can(provider.CapConstraints) {
		t.Fatalf("capabilities %v: want constraints", p.Caps())
	}
	vocab := provider.Describe(p).Constraints
	if err := provider.CheckVocabulary(vocab); err != nil {
		t.Fatal(err)
	}
	mem, cores := provider.LookupConstraint(vocab, provider.ConstraintMem), provider.LookupConstraint(vocab, provider.ConstraintCores)
	if mem == nil || mem.Attribute != "memory" || mem.Max == nil || *mem.Max < 64 || cores == nil || cores.Attribute != "cpus" || *cores.Max != float64(runtime.NumCPU()) {
		t.Fatalf("vocabulary: %+v", vocab)
	}
	if disk := provider.LookupConstraint(vocab, provider.ConstraintDisk); disk == nil || disk.Attribute != "disk_mb" || disk.Max == nil || *disk.Min != 64 {
		t.Fatalf("disk constraint: %+v", disk)
	}
	st, err := p.Stack(&provider.BaseStack{Provider: p})
	if err != nil {
		t.Fatal(err)
	}
	cv := st.(provider.ConstraintsValidator)
	if err := cv.ValidateConstraints(t.Context(), map[string]any{"hostname": "vm", "memory": 512.0, "cpus": 0.5, "tags": map[string]any{"a": "b"}}); err != nil {
		t.Errorf("a machine this host can run: %v", err)
	}
	if err := cv.ValidateConstraints(t.Context(), map[string]any{"disk_mb": 10.0}); err == nil || !strings.Contains(err.Error(), "nearest valid: 64") {
		t.Errorf("disk_mb = 10: %v", err)
	}
	err = cv.ValidateConstraints(t.Context(), map[string]any{"memory": *mem.Max + 1000, "cpus": 1000.0})
	var ce *provider.ConstraintError
	if !errors.As(err, &ce) || ce.Constraint != provider.ConstraintCores || ce.Nearest != *cores.Max {
		t.Fatalf("too many cpus: %v (%+v)", err, ce)
	}
	if !strings.Contains(err.Error(), "MB this host allows") || !strings.Contains(err.Error(), "CPUs this host allows") {
		t.Errorf("too much memory and cpus: %v", err)
	}
	t.Log(err)
}
