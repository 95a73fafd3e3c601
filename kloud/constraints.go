package kloud

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/provider"
)

// Constraints: before terraform builds anything, kloud asks the provider of every machine
// (those advertising provider.CapConstraints) whether the machine's planned attributes are
// within what it can give (provider.ConstraintsValidator), at stack.plan and stack.create (on
// terraform's plan, in plan), at stack.apply of a stack never built (on the machines' recorded
// attributes, the planned ones) and at stack.update and stack.apply of a built stack (on the
// update's plan). Attributes are checked as plain JSON values (plainAttrs). A refusal is
// invalid params (-32602) whose message names each machine, the attribute, what is allowed
// and the nearest valid value, and whose data.details lists them (api.ConstraintViolation).

// checkConstraints validates planned machines of owner's stack in team with their providers
// (a provider's bounds may be the owner's: the vagrant provider asks the owner's host); nil if
// all pass or no provider checks constraints.
func (a *stackAPI) checkConstraints(ctx context.Context, owner, team string, ms []api.PlannedMachine) error {
	byProvider := map[string][]api.PlannedMachine{}
	for _, m := range ms {
		byProvider[m.Provider] = append(byProvider[m.Provider], m)
	}
	var violations []api.ConstraintViolation
	for _, name := range slices.Sorted(maps.Keys(byProvider)) {
		p, err := a.providers.Lookup(name)
		if err != nil || !p.Can(provider.CapConstraints) {
			continue
		}
		machines := byProvider[name]
		bs := &provider.BaseStack{Provider: p, Owner: owner, Team: team, Log: a.log.With("provider", name)}
		for i, m := range machines {
			machines[i].Attributes = plainAttrs(m.Attributes)
			bs.Machines = append(bs.Machines, &provider.MachineSpec{Label: m.Label, Resource: m.Resource, Index: m.Index, Provider: name, Attributes: machines[i].Attributes})
		}
		st, err := p.Stack(bs)
		if err != nil {
			return fmt.Errorf("provider %s: %w", name, err)
		}
		cv, ok := st.(provider.ConstraintsValidator)
		if !ok {
			// Advertised but not implemented: the conformance suite fails such a provider.
			a.log.WarnContext(ctx, "provider advertises constraints but its stack does not validate them", "provider", name)
			continue
		}
		for _, m := range machines {
			err := cv.ValidateConstraints(ctx, m.Attributes)
			switch {
			case err == nil:
			case errors.Is(err, provider.ErrConstraint) || errors.Is(err, kite.ErrInvalidParams):
				violations = append(violations, violationsOf(p, m, err)...)
			default:
				return fmt.Errorf("provider %s: check the constraints of machine %s: %w", name, m.Label, err)
			}
		}
	}
	if len(violations) == 0 {
		return nil
	}
	msgs := make([]string, len(violations))
	for i, v := range violations {
		msgs[i] = fmt.Sprintf("machine %s (%s): %s", v.Machine, v.Resource, v.Message)
	}
	return &kite.Error{Code: kite.CodeInvalidParams,
		Message: strings.Join(msgs, "; ") + " (change the template or its variables)",
		Data:    &kite.ErrorData{Type: api.ConstraintViolationType, Details: violations}}
}

// plainAttrs returns attributes as a plan's JSON has them (objects map[string]any, lists []any,
// numbers float64): what the store gives back for a machine's recorded attributes has its
// driver's types (nested documents bson.M, arrays bson.A, int32 and int64), which a provider's
// checks would not take for a map, a list or a number. Attributes that do not encode are
// returned as they are.
func plainAttrs(attrs map[string]any) map[string]any {
	b, err := json.Marshal(attrs)
	if err != nil {
		return attrs
	}
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		return attrs
	}
	return out
}

// violationsOf turns a provider's refusal of machine m into violations: one per
// provider.ConstraintError it joins, or one with its message.
func violationsOf(p *provider.Provider, m api.PlannedMachine, err error) []api.ConstraintViolation {
	base := api.ConstraintViolation{Machine: m.Label, Provider: p.Name, Resource: p.ResourceType + "." + m.Resource}
	var out []api.ConstraintViolation
	var walk func(error)
	walk = func(e error) {
		if ce, ok := e.(*provider.ConstraintError); ok {
			v := base
			v.Constraint, v.Attribute, v.Value, v.Allowed, v.Nearest, v.Message = ce.Constraint, ce.Attribute, ce.Value, ce.Allowed, ce.Nearest, ce.Error()
			out = append(out, v)
			return
		}
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			for _, x := range j.Unwrap() {
				walk(x)
			}
			return
		}
		if u := errors.Unwrap(e); u != nil {
			walk(u)
		}
	}
	walk(err)
	if len(out) == 0 {
		v := base
		v.Message = strings.ReplaceAll(err.Error(), "\n", "; ")
		out = append(out, v)
	}
	return out
}

// checkStackConstraints validates a stack's machines as recorded (their planned attributes: a
// stack that was built converges as an update, whose plan is checked instead) before stack.apply
// builds it.
func (a *stackAPI) checkStackConstraints(ctx context.Context, st *model.Stack) error {
	ms, err := a.srv.flow().StackMachines(ctx, st.ID)
	if err != nil {
		return err
	}
	return a.checkConstraints(ctx, st.Owner, st.Team, plannedOf(ms))
}

// plannedOf is machines ms as a plan would list them (their planned attributes).
func plannedOf(ms []model.Machine) []api.PlannedMachine {
	planned := make([]api.PlannedMachine, 0, len(ms))
	for _, m := range ms {
		planned = append(planned, api.PlannedMachine{Label: m.Label, Provider: m.Provider, Resource: m.Resource, Index: m.Index, Attributes: m.Attributes})
	}
	return planned
}
