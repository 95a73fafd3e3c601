package kloud

import (
	"testing"
	"time"
)

// TestLimitsDefaults: zero limits take the defaults; a global cap above the hard ceiling is
// refused (kloud serve says so at start).
func TestLimitsDefaults(t *testing.T) {
	t.Parallel()
	var l Limits
	if err := l.defaults(); err != nil || l.MaxMachinesPerStack != DefaultMaxMachinesPerStack || l.PlanTimeout != DefaultPlanTimeout {
		t.Fatalf("zero limits: %+v, %v", l, err)
	}
	l = Limits{MaxMachinesPerStack: MaxMachinesCeiling, PlanTimeout: time.Second}
	if err := l.defaults(); err != nil || l.MaxMachinesPerStack != MaxMachinesCeiling || l.PlanTimeout != time.Second {
		t.Fatalf("limits at the ceiling: %+v, %v", l, err)
	}
	l = Limits{MaxMachinesPerStack: MaxMachinesCeiling + 1}
	if err := l.defaults(); err == nil {
		t.Fatalf("a cap above the ceiling: %+v accepted", l)
	}
}
