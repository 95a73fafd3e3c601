package providertest

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/provider/tmpl"
)

// Constraints: a provider that advertises constraints describes its vocabulary (a valid one),
// its stack refuses an attribute outside it with a provider.ConstraintError whose nearest valid
// value it accepts, and kloud refuses stack.plan of a template asking for that attribute with
// invalid params naming the machine, the attribute and the nearest valid value, and plans the
// nearest value.
func (s *suite) testConstraints(t *testing.T) {
	s.needCap(t, provider.CapConstraints)
	ctx := t.Context()
	res, err := s.cl.ProviderDescribe(ctx, api.ProviderDescribeParams{Provider: s.p.Name})
	if err != nil || len(res.Providers) != 1 {
		t.Fatalf("provider.describe: %+v, %v", res, err)
	}
	vocab := res.Providers[0].Constraints
	if len(vocab) == 0 {
		t.Fatalf("provider %s advertises %q but describes no constraints vocabulary (Provider.Constraints)", s.p.Name, provider.CapConstraints)
	}
	if err := provider.CheckVocabulary(vocab); err != nil {
		t.Errorf("the constraints vocabulary: %v", err)
	}
	if b, err := json.Marshal(vocab); err == nil {
		t.Logf("vocabulary: %s", b)
	}
	st, err := s.p.Stack(&provider.BaseStack{Provider: s.p, Team: team, Owner: user, Log: testutil.Logger(t)})
	if err != nil {
		t.Fatalf("the provider's Stack: %v", err)
	}
	cv, ok := st.(provider.ConstraintsValidator)
	if !ok {
		t.Fatalf("provider %s advertises %q, but its stack does not implement provider.ConstraintsValidator", s.p.Name, provider.CapConstraints)
	}
	// A value outside the first constraint that has an attribute and a bound or a list of values.
	var c *provider.Constraint
	var bad any
	for i := range vocab {
		v := &vocab[i]
		switch {
		case v.Attribute == "":
		case (v.Type == provider.ConstraintInteger || v.Type == provider.ConstraintNumber) && v.Max != nil:
			c, bad = v, *v.Max*2+1
		case v.Type == provider.ConstraintString && len(v.Values) > 0:
			c, bad = v, "no-such-"+v.Name
		}
		if c != nil {
			break
		}
	}
	if c == nil {
		t.Skipf("no constraint of %s has an attribute with a maximum or a list of values to exceed", s.p.Name)
	}
	err = cv.ValidateConstraints(ctx, map[string]any{c.Attribute: bad})
	var ce *provider.ConstraintError
	if !errors.Is(err, provider.ErrConstraint) || !errors.As(err, &ce) {
		t.Fatalf("ValidateConstraints(%s = %v): %v, want a *provider.ConstraintError", c.Attribute, bad, err)
	}
	if ce.Attribute != c.Attribute || ce.Nearest == nil || !strings.Contains(err.Error(), c.Attribute) || !strings.Contains(err.Error(), "nearest valid") {
		t.Errorf("ValidateConstraints(%s = %v): %+v (%v): want the attribute named and a nearest valid value", c.Attribute, bad, ce, err)
	}
	nearest := ce.Nearest
	if err := cv.ValidateConstraints(ctx, map[string]any{c.Attribute: nearest}); err != nil {
		t.Errorf("ValidateConstraints of the nearest valid value %s = %v: %v", c.Attribute, nearest, err)
	}
	t.Logf("the provider refuses %s = %v: %v", c.Attribute, bad, err)

	// Through kloud: stack.plan of the template with the attribute set.
	if s.p.HasPart(provider.PartCredential) && s.goodCred == "" {
		t.Skip("stack.plan needs the good credential, which the Credential subtest did not add")
	}
	files := s.c.Template(1)
	plan := func(files map[string]string) (api.StackPlanResult, error) {
		tp, err := s.cl.TemplateCreate(ctx, api.TemplateParams{Title: "constraints", Files: files})
		if err != nil {
			t.Fatalf("template.create: %v", err)
		}
		p := api.StackPlanParams{TemplateID: tp.ID}
		if s.goodCred != "" {
			p.Credentials = map[string]string{s.p.Name: s.goodCred}
		}
		return s.cl.StackPlan(ctx, p)
	}
	bytesFiles := map[string][]byte{}
	for n, c := range files {
		bytesFiles[n] = []byte(c)
	}
	cfg, err := tmpl.Parse(bytesFiles)
	if err != nil {
		t.Fatalf("Config.Template(1): %v", err)
	}
	rs := cfg.Resources(s.p.ResourceType)
	if len(rs) == 0 {
		t.Fatalf("Config.Template(1) has no %s resource", s.p.ResourceType)
	}
	m := rs[0]
	withBad, err := setAttribute(files, s.p.ResourceType, m.Name, c.Attribute, bad)
	if err != nil {
		t.Skipf("cannot set %s in Config.Template's files: %v", c.Attribute, err)
	}
	_, err = plan(withBad)
	if !errors.Is(err, kite.ErrInvalidParams) {
		t.Fatalf("stack.plan with %s = %v: %v, want invalid params", c.Attribute, bad, err)
	}
	for _, w := range []string{"machine " + m.Name, "(" + s.p.ResourceType + "." + m.Name + ")", c.Attribute, "nearest valid"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("stack.plan with %s = %v: %q does not say %q", c.Attribute, bad, err, w)
		}
	}
	t.Logf("stack.plan refused: %v", err)
	withNearest, _ := setAttribute(files, s.p.ResourceType, m.Name, c.Attribute, nearest)
	if _, err := plan(withNearest); err != nil {
		t.Errorf("stack.plan with the nearest valid value %s = %v: %v", c.Attribute, nearest, err)
	}
}

// setAttribute sets attr = v in the HCL block of resource typ.name in files (replacing the
// attribute's line if the block has one at its top level).
func setAttribute(files map[string]string, typ, name, attr string, v any) (map[string]string, error) {
	val, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	if f, ok := v.(float64); ok {
		val = []byte(strconv.FormatFloat(f, 'f', -1, 64))
	}
	open := regexp.MustCompile(`(?m)^resource\s+"` + regexp.QuoteMeta(typ) + `"\s+"` + regexp.QuoteMeta(name) + `"\s*\{[ \t]*\n`)
	line := regexp.MustCompile(`(?m)^([ \t]*)` + regexp.QuoteMeta(attr) + `[ \t]*=.*$`)
	out := map[string]string{}
	found := false
	for n, src := range files {
		out[n] = src
		loc := open.FindStringIndex(src)
		if loc == nil || !strings.HasSuffix(n, ".tf") {
			continue
		}
		found = true
		body := src[loc[1]:]
		end := strings.Index(body, "\n}")
		if end < 0 {
			return nil, fmt.Errorf("%s: resource %s.%s does not end with a closing brace on its own line", n, typ, name)
		}
		block := body[:end]
		if l := line.FindStringSubmatchIndex(block); l != nil {
			block = block[:l[0]] + block[l[2]:l[3]] + attr + " = " + string(val) + block[l[1]:]
		} else {
			block = "  " + attr + " = " + string(val) + "\n" + block
		}
		out[n] = src[:loc[1]] + block + body[end:]
	}
	if !found {
		return nil, fmt.Errorf("no HCL file declares resource %s.%s on a line of its own", typ, name)
	}
	return out, nil
}
