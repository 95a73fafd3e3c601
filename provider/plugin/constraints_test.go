package plugin_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/provider/plugin"
)

// validating is a plugin's stack that checks constraints.
type validating struct {
	provider.Stack
	vocab []provider.Constraint
}

func (v *validating) ValidateConstraints(ctx context.Context, attrs map[string]any) error {
	return provider.ValidateConstraints(v.vocab, attrs)
}

// TestConstraintsOverTheWire: a plugin's vocabulary reaches kloud's proxy (provider.describe),
// the proxy advertises constraints, and a refusal comes back as invalid params with the
// plugin's message (attribute, allowed values, nearest valid value); a valid machine passes.
func TestConstraintsOverTheWire(t *testing.T) {
	e := startKloud(t)
	vocab := []provider.Constraint{{Name: provider.ConstraintMem, Attribute: "memory", Type: provider.ConstraintInteger, Unit: "MB",
		Min: provider.Bounds(64), Max: provider.Bounds(2048), Bound: "the files cloud"}}
	p := filesProvider("cons", newSeen("a"), noUnavailable())
	inner := p.Stack
	p.Stack = func(b *provider.BaseStack) (provider.Stack, error) {
		st, err := inner(b)
		return &validating{Stack: st, vocab: vocab}, err
	}
	p.Constraints = func() []provider.Constraint { return vocab }
	m, err := plugin.ManifestOf(p)
	if err != nil || !slices.Contains(m.Capabilities, provider.CapConstraints) || len(m.Constraints) != 1 {
		t.Fatalf("manifest: %+v, %v: want constraints advertised and the vocabulary", m, err)
	}
	e.run(p, e.pluginKey("cons"))
	e.wait("cons")
	proxy, err := e.reg.Lookup("cons")
	if err != nil {
		t.Fatal(err)
	}
	if !proxy.Can(provider.CapConstraints) {
		t.Fatalf("proxy capabilities %v", proxy.Caps())
	}
	if d := provider.Describe(proxy); len(d.Constraints) != 1 || d.Constraints[0].Name != "mem" || *d.Constraints[0].Max != 2048 {
		t.Fatalf("proxy describes constraints %+v", d.Constraints)
	}
	st, err := proxy.Stack(&provider.BaseStack{Provider: proxy, Team: "t", Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	cv := st.(provider.ConstraintsValidator)
	if err := cv.ValidateConstraints(t.Context(), map[string]any{"memory": 512.0}); err != nil {
		t.Errorf("memory 512: %v", err)
	}
	err = cv.ValidateConstraints(t.Context(), map[string]any{"memory": 4096.0})
	if !errors.Is(err, provider.ErrConstraint) || strings.Contains(err.Error(), "not satisfied") || !strings.Contains(err.Error(), "mem (memory) 4096 MB is more than the 2048 MB the files cloud allows") ||
		!strings.Contains(err.Error(), "nearest valid: 2048") {
		t.Fatalf("memory 4096 through the proxy: %v", err)
	}

	// A manifest with a bad vocabulary is refused.
	bad := *m
	bad.Name = "cons2"
	bad.Constraints = []provider.Constraint{{Name: "mem", Type: "bytes"}}
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "provider.constraints") {
		t.Errorf("manifest with a bad vocabulary: %v", err)
	}
}
