package kloud

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/provider/tmpl"
)

// Limits (issue 19): how many machines one stack may have, and how long a terraform plan made
// for a call may run. The cap is checked before terraform runs wherever the count is known from
// the files (a literal count, or one of variables: their values or defaults; tmpl.Config.Count),
// at template.create/update, stack.plan, stack.create, stack.apply, stack.update and stack.scale,
// and always on the machines terraform planned. A refusal is invalid params (-32602), before any
// job or stack change.

const (
	// DefaultMaxMachinesPerStack is the global cap on machines per stack (kloud serve
	// --max-machines-per-stack).
	DefaultMaxMachinesPerStack = 20
	// MaxMachinesCeiling is the hard ceiling of every cap, global or per template.
	MaxMachinesCeiling = 1000
	// DefaultPlanTimeout bounds a terraform plan made for a call (kloud serve --plan-timeout).
	DefaultPlanTimeout = 2 * time.Minute
)

// Limits configure the caps of kloud.
type Limits struct {
	// MaxMachinesPerStack is the global cap on the machines of one stack (default
	// DefaultMaxMachinesPerStack, at most MaxMachinesCeiling). A template's own cap
	// (Template.MaxMachines, set by an administrator) replaces it for the template's stacks.
	MaxMachinesPerStack int
	// PlanTimeout is the wall-time limit of a terraform plan of a template's machines
	// (stack.plan, stack.create, the plans of stack.update and stack.scale at the call and in
	// their job; the preview of stack.plan of a stack): when it passes, or the caller gives up,
	// the terraform run is cancelled and killed (default DefaultPlanTimeout).
	PlanTimeout time.Duration
	// RateLimit is how many kloud calls a second each user may make, on average (ratelimit.go;
	// kloud serve --rate-limit, default DefaultRateLimit there); 0: no limit (the default here).
	RateLimit float64
	// RateBurst is how many calls a user may make at once, the size of the bucket (default:
	// RateLimit rounded up).
	RateBurst int
}

func (l *Limits) defaults() error {
	if l.MaxMachinesPerStack <= 0 {
		l.MaxMachinesPerStack = DefaultMaxMachinesPerStack
	}
	if l.MaxMachinesPerStack > MaxMachinesCeiling {
		return fmt.Errorf("kloud: --max-machines-per-stack %d is above the ceiling %d", l.MaxMachinesPerStack, MaxMachinesCeiling)
	}
	if l.PlanTimeout <= 0 {
		l.PlanTimeout = DefaultPlanTimeout
	}
	if l.RateLimit < 0 || l.RateBurst < 0 {
		return fmt.Errorf("kloud: --rate-limit %g, --rate-burst %d: want 0 (no limit) or more", l.RateLimit, l.RateBurst)
	}
	return nil
}

// machineCaps are the caps on machines per stack: kloud's own, or a template's
// (Template.MaxMachines) for the template's stacks; the Server's checks below build one.
type machineCaps struct {
	perStack int      // kloud's cap (Limits.MaxMachinesPerStack)
	types    []string // the providers' machine resource types (Server.resourceTypes)
}

// of is the cap on machines per stack of template t (nil: a template that is gone) and how an
// administrator changes it, for the refusal's message.
func (m machineCaps) of(t *model.Template) (limit int, how string) {
	if t != nil && t.MaxMachines > 0 {
		return t.MaxMachines, fmt.Sprintf("the cap of template %s; an administrator changes it with `kloud template update %s --max-machines N` (at most %d)", t.ID, t.ID, MaxMachinesCeiling)
	}
	return m.perStack, fmt.Sprintf("kloud's cap per stack; an administrator raises it with `kloud serve --max-machines-per-stack N`, or for one template with `kloud template update ID --max-machines N` (at most %d)", MaxMachinesCeiling)
}

// stackTemplate is the template a stack was made from, for its cap (nil when it is gone).
func (s *Server) stackTemplate(ctx context.Context, id string) *model.Template {
	t, err := s.store.Templates().Get(ctx, id)
	if err != nil {
		return nil
	}
	return &t
}

// tooManyMachines is the refusal of a stack of n machines (what: where the count comes from).
func tooManyMachines(what string, n int64, limit int, how string) error {
	return fmt.Errorf("%s asks for %d machines; the limit is %s per stack (%s): %w", what, n, machineCount(limit), how, kite.ErrInvalidParams)
}

// staticCount sums the counts of the template's machine resources that are known before
// terraform runs (tmpl.Config.Count with vars); it names the resources counted.
func (m machineCaps) staticCount(cfg *tmpl.Config, vars map[string]any) (n int64, what string) {
	var parts []string
	for _, typ := range m.types {
		for _, r := range cfg.Resources(typ) {
			if strings.HasPrefix(r.Name, "kloud_") {
				continue
			}
			c, known, err := cfg.Count(r.Type, r.Name, vars)
			if err != nil || !known {
				continue
			}
			n += max(c, 0)
			parts = append(parts, fmt.Sprintf("%s.%s: %d", r.Type, r.Name, c))
		}
	}
	slices.Sort(parts)
	return n, strings.Join(parts, ", ")
}

// check refuses files whose machine count, as far as it is known before terraform runs, is
// above template t's cap. vars are the stack's variables.
func (m machineCaps) check(t *model.Template, cfg *tmpl.Config, vars map[string]any) error {
	limit, how := m.of(t)
	if n, what := m.staticCount(cfg, vars); n > int64(limit) {
		return tooManyMachines("the template ("+what+")", n, limit, how)
	}
	return nil
}

// capBuild checks a built template against t's cap before terraform plans it, and records the
// cap for the check of the planned machines (plan).
func (s *Server) capBuild(t *model.Template, b *builtTemplate) error {
	caps := machineCaps{perStack: s.opts.Limits.MaxMachinesPerStack, types: s.resourceTypes()}
	b.maxMachines, b.capHow = caps.of(t)
	return caps.check(t, b.cfg, b.variables)
}

// checkPlannedCount is the check after terraform's plan: n machines planned.
func (s *Server) checkPlannedCount(b *builtTemplate, n int) error {
	limit, how := b.maxMachines, b.capHow
	if limit <= 0 {
		limit, how = machineCaps{perStack: s.opts.Limits.MaxMachinesPerStack}.of(nil)
	}
	if n > limit {
		return tooManyMachines("terraform's plan", int64(n), limit, how)
	}
	return nil
}

// checkStackCap is stack.apply's check of a stack made before the cap (or before it was
// lowered): its files and variables, and its machines as stack.create recorded them.
func (s *Server) checkStackCap(ctx context.Context, st *model.Stack) error {
	cfg, _, err := s.machineResources(fileMap(st.Files))
	if err != nil {
		return err
	}
	t := s.stackTemplate(ctx, st.TemplateID)
	vars := map[string]any{}
	for k, v := range st.Variables {
		vars[k] = v
	}
	caps := machineCaps{perStack: s.opts.Limits.MaxMachinesPerStack, types: s.resourceTypes()}
	if err := caps.check(t, cfg, vars); err != nil {
		return err
	}
	if limit, how := caps.of(t); len(st.Machines) > limit {
		return tooManyMachines("stack "+st.ID, int64(len(st.Machines)), limit, how)
	}
	return nil
}

// checkTemplateCap is the check at template save: the count with the variables' defaults.
func (s *Server) checkTemplateCap(t *model.Template, files map[string][]byte) error {
	cfg, err := tmpl.Parse(files)
	if err != nil {
		return fmt.Errorf("template: %s: %w", err.Error(), kite.ErrInvalidParams)
	}
	return machineCaps{perStack: s.opts.Limits.MaxMachinesPerStack, types: s.resourceTypes()}.check(t, cfg, nil)
}

// setTemplateCap validates an administrator's per-template cap (template.update maxMachines).
func setTemplateCap(c *Caller, n int) error {
	if !c.TemplateAdmin() {
		return fmt.Errorf("only a kloud owner or template admin sets a template's machine cap: %w", kite.ErrPermission)
	}
	if n < 1 || n > MaxMachinesCeiling {
		return fmt.Errorf("maxMachines %d: a template's cap is 1 to %d machines per stack: %w", n, MaxMachinesCeiling, kite.ErrInvalidParams)
	}
	return nil
}

// errPlanTimeout is the cause of a plan's ctx when the plan timeout passed.
var errPlanTimeout = errors.New("plan timeout")

// planCtx bounds a plan made for a call by the plan timeout, Limits.PlanTimeout (the call's own
// ctx ends when its caller gives up: kite.cancel, or the connection closes).
func (s *Server) planCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeoutCause(ctx, s.opts.Limits.PlanTimeout, errPlanTimeout)
}

// planStopped explains a plan stopped by ctx (planCtx): the plan timeout, or the caller gone.
func (s *Server) planStopped(ctx context.Context) error {
	if errors.Is(context.Cause(ctx), errPlanTimeout) {
		return fmt.Errorf("terraform plan: it ran longer than the plan timeout (%s; kloud serve --plan-timeout) and was cancelled: %w", s.opts.Limits.PlanTimeout, kite.ErrTimeout)
	}
	return fmt.Errorf("terraform plan: cancelled: %w", ctx.Err())
}
