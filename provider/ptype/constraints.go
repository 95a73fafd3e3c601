package ptype

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
)

// Constraints: what a machine may ask for (Juju's constraints vocabulary: cores, mem, disk,
// arch, zone, tags, instance-type), how a provider declares which of them it takes
// (Provider.Constraints, shown by provider.describe) and how a machine's planned attributes are
// checked against them (ValidateConstraints, called by a provider's ConstraintsValidator; kloud
// calls that for every machine at plan time and refuses the plan with the ConstraintError).

// Constraint names: Juju's vocabulary. A provider may declare others.
const (
	ConstraintCores        = "cores"         // CPUs (a number: a cgroup quota may be fractional)
	ConstraintMem          = "mem"           // memory, MB
	ConstraintDisk         = "disk"          // the machine's writable disk, MB
	ConstraintArch         = "arch"          // CPU architecture (amd64, arm64, ...)
	ConstraintZone         = "zone"          // availability zone
	ConstraintTags         = "tags"          // tags kept with the machine
	ConstraintInstanceType = "instance-type" // a cloud's machine type (conflicts with cores and mem)
)

// Types of constraint values (Constraint.Type).
const (
	ConstraintInteger = "integer"
	ConstraintNumber  = "number"
	ConstraintString  = "string"
	ConstraintList    = "list" // a list of strings
	ConstraintMap     = "map"  // string → string
)

// Constraint is one entry of a provider's constraints vocabulary: which attribute of its machine
// resource carries it, its type and unit, and what is allowed.
type Constraint struct {
	// Name is the vocabulary's name (ConstraintCores, ...).
	Name string `json:"name"`
	// Attribute is the machine resource's attribute that sets it ("memory"). Empty: the
	// provider's machines have it but no template can choose it (e.g. the host's arch); Values
	// then says what it is.
	Attribute string `json:"attribute,omitempty"`
	// Type is ConstraintInteger, ConstraintNumber, ConstraintString, ConstraintList or
	// ConstraintMap.
	Type string `json:"type"`
	// Unit of a number ("MB", "CPUs"), shown with values.
	Unit string `json:"unit,omitempty"`
	// Min and Max bound a number (nil: no bound).
	Min *float64 `json:"min,omitempty"`
	Max *float64 `json:"max,omitempty"`
	// Bound says who sets Max, for messages ("this host": "... is more than the 7963 MB this
	// host allows"). Empty: "the provider".
	Bound string `json:"bound,omitempty"`
	// Values are the allowed values of a string, or of a list's elements. Empty: any.
	Values []string `json:"values,omitempty"`
	// Conflicts names the constraints that may not be set together with this one
	// (instance-type excludes cores and mem on a cloud with machine types).
	Conflicts []string `json:"conflicts,omitempty"`
	// Description is one line for the UI and CLI.
	Description string `json:"description,omitempty"`
}

// Bounds returns a pointer to v, for Constraint.Min and Max.
func Bounds(v float64) *float64 { return &v }

// ErrConstraint is wrapped by every ConstraintError: kloud maps it to invalid params (-32602).
var ErrConstraint = errors.New("constraint not satisfied")

// ConstraintError is a machine attribute outside its constraint: which, the value asked for,
// what is allowed and the nearest valid value. Its message reads like "mem (memory) 100000 MB is
// more than the 7963 MB this host allows; nearest valid: 7963".
type ConstraintError struct {
	Constraint string `json:"constraint"`
	Attribute  string `json:"attribute"`
	Value      any    `json:"value"`
	Unit       string `json:"unit,omitempty"`
	// Allowed says what is allowed, in words ("32-7963 MB", "one of amd64").
	Allowed string `json:"allowed"`
	// Nearest is the nearest valid value; nil if there is none to suggest (a conflict).
	Nearest any `json:"nearest,omitempty"`
	// Reason is the sentence after the value ("is more than the 7963 MB this host allows").
	Reason string `json:"reason"`
}

func (e *ConstraintError) Error() string {
	var b strings.Builder
	b.WriteString(e.Constraint)
	if e.Attribute != "" && e.Attribute != e.Constraint {
		fmt.Fprintf(&b, " (%s)", e.Attribute)
	}
	if e.Value != nil {
		fmt.Fprintf(&b, " %s", formatValue(e.Value))
		if _, isNum := Number(e.Value); isNum && e.Unit != "" {
			fmt.Fprintf(&b, " %s", e.Unit)
		}
	}
	fmt.Fprintf(&b, " %s", e.Reason)
	if e.Allowed != "" && !strings.Contains(e.Reason, e.Allowed) {
		fmt.Fprintf(&b, " (allowed: %s)", e.Allowed)
	}
	if e.Nearest != nil {
		fmt.Fprintf(&b, "; nearest valid: %s", formatValue(e.Nearest))
	}
	return b.String()
}

// Unwrap makes errors.Is(err, ErrConstraint) true.
func (e *ConstraintError) Unwrap() error { return ErrConstraint }

// LookupConstraint returns the constraint called name, or nil.
func LookupConstraint(vocab []Constraint, name string) *Constraint {
	for i := range vocab {
		if vocab[i].Name == name {
			return &vocab[i]
		}
	}
	return nil
}

// CheckVocabulary reports what is wrong with a vocabulary: unnamed or repeated constraints, an
// unknown type, Min above Max, a conflict naming no constraint of it.
func CheckVocabulary(vocab []Constraint) error {
	var errs []error
	seen := map[string]bool{}
	for _, c := range vocab {
		switch {
		case c.Name == "":
			errs = append(errs, fmt.Errorf("a constraint without a name (attribute %q)", c.Attribute))
		case seen[c.Name]:
			errs = append(errs, fmt.Errorf("constraint %s declared twice", c.Name))
		}
		seen[c.Name] = true
		if !slices.Contains([]string{ConstraintInteger, ConstraintNumber, ConstraintString, ConstraintList, ConstraintMap}, c.Type) {
			errs = append(errs, fmt.Errorf("constraint %s: type %q: want integer, number, string, list or map", c.Name, c.Type))
		}
		if c.Min != nil && c.Max != nil && *c.Min > *c.Max {
			errs = append(errs, fmt.Errorf("constraint %s: min %g is above max %g", c.Name, *c.Min, *c.Max))
		}
	}
	for _, c := range vocab {
		for _, o := range c.Conflicts {
			if !seen[o] {
				errs = append(errs, fmt.Errorf("constraint %s conflicts with %s, which the vocabulary does not have", c.Name, o))
			}
		}
	}
	return errors.Join(errs...)
}

// ValidateConstraints checks a machine's planned attributes against vocab: every attribute a
// constraint names that is set (not absent, not null) has the constraint's type and lies in its
// range or values, and no two conflicting constraints are both set. It returns nil or the
// *ConstraintError of every violation, joined (errors.As finds the first). Attributes the
// vocabulary does not name are not its business (Terraform's schema checks them).
func ValidateConstraints(vocab []Constraint, attrs map[string]any) error {
	var errs []error
	set := map[string]bool{}
	for _, c := range vocab {
		if c.Attribute == "" {
			continue
		}
		v, ok := attrs[c.Attribute]
		if !ok || v == nil {
			continue
		}
		set[c.Name] = true
		if err := c.Check(v); err != nil {
			errs = append(errs, err)
		}
	}
	// Each pair of conflicting constraints both set, once (either side may declare it).
	reported := map[[2]string]bool{}
	for _, c := range vocab {
		for _, o := range c.Conflicts {
			pair := [2]string{min(c.Name, o), max(c.Name, o)}
			if !set[c.Name] || !set[o] || reported[pair] {
				continue
			}
			reported[pair] = true
			a, b := LookupConstraint(vocab, pair[0]), LookupConstraint(vocab, pair[1])
			errs = append(errs, &ConstraintError{Constraint: a.Name, Attribute: a.Attribute,
				Reason: fmt.Sprintf("conflicts with %s (%s): set one of them", b.Name, b.Attribute)})
		}
	}
	return errors.Join(errs...)
}

// Check checks one value of constraint c, returning a *ConstraintError or nil.
func (c *Constraint) Check(v any) error {
	bad := func(reason, allowed string, nearest any) error {
		return &ConstraintError{Constraint: c.Name, Attribute: c.Attribute, Value: v, Unit: c.Unit, Reason: reason, Allowed: allowed, Nearest: nearest}
	}
	switch c.Type {
	case ConstraintInteger, ConstraintNumber:
		f, ok := Number(v)
		if !ok {
			return bad("is not a number", c.rangeText(), nil)
		}
		n, reason := c.Nearest(f)
		if reason == "" {
			return nil
		}
		return bad(reason, c.rangeText(), c.number(n))
	case ConstraintString:
		s, ok := v.(string)
		if !ok {
			return bad("is not a string", c.valuesText(), nil)
		}
		if len(c.Values) > 0 && !slices.Contains(c.Values, s) {
			return bad("is not one of "+c.valuesText(), c.valuesText(), NearestString(c.Values, s))
		}
	case ConstraintList:
		l, ok := asList(v)
		if !ok {
			return bad("is not a list", c.valuesText(), nil)
		}
		for _, e := range l {
			s, ok := e.(string)
			if !ok {
				return bad(fmt.Sprintf("has %s, which is not a string", formatValue(e)), c.valuesText(), nil)
			}
			if len(c.Values) > 0 && !slices.Contains(c.Values, s) {
				return bad(fmt.Sprintf("has %q, which is not one of %s", s, c.valuesText()), c.valuesText(), NearestString(c.Values, s))
			}
		}
	case ConstraintMap:
		m, ok := asMap(v)
		if !ok {
			return bad("is not a map", "", nil)
		}
		for k, e := range m {
			if _, ok := e.(string); !ok {
				return bad(fmt.Sprintf("has %s = %s, which is not a string", k, formatValue(e)), "string values", nil)
			}
		}
	}
	return nil
}

// Nearest returns the valid value nearest to f (f itself if valid) and, if f is not valid, why
// ("is more than the 7963 MB this host allows"); an integer constraint rounds.
func (c *Constraint) Nearest(f float64) (float64, string) {
	unit := ""
	if c.Unit != "" {
		unit = " " + c.Unit
	}
	bound := c.Bound
	if bound == "" {
		bound = "the provider"
	}
	switch {
	case c.Min != nil && f < *c.Min:
		n := *c.Min
		if c.Type == ConstraintInteger {
			n = math.Ceil(n)
		}
		return n, fmt.Sprintf("is less than the %s%s %s allows", formatNumber(*c.Min), unit, bound)
	case c.Max != nil && f > *c.Max:
		n := *c.Max
		if c.Type == ConstraintInteger {
			n = math.Floor(n)
		}
		return n, fmt.Sprintf("is more than the %s%s %s allows", formatNumber(*c.Max), unit, bound)
	case c.Type == ConstraintInteger && f != math.Trunc(f):
		n := math.Round(f)
		if c.Max != nil && n > *c.Max {
			n = math.Floor(f)
		}
		if c.Min != nil && n < *c.Min {
			n = math.Ceil(f)
		}
		return n, "is not a whole number"
	}
	return f, ""
}

func (c *Constraint) number(f float64) any {
	if c.Type == ConstraintInteger {
		return int64(f)
	}
	return f
}

func (c *Constraint) rangeText() string {
	unit := ""
	if c.Unit != "" {
		unit = " " + c.Unit
	}
	switch {
	case c.Min != nil && c.Max != nil:
		return formatNumber(*c.Min) + "-" + formatNumber(*c.Max) + unit
	case c.Min != nil:
		return "at least " + formatNumber(*c.Min) + unit
	case c.Max != nil:
		return "at most " + formatNumber(*c.Max) + unit
	}
	return "any " + c.Type
}

func (c *Constraint) valuesText() string {
	if len(c.Values) == 0 {
		return "any " + c.Type
	}
	return strings.Join(c.Values, ", ")
}

// NearestString returns the value of values nearest to s: equal ignoring case, else the one with
// the smallest edit distance (the first of equals). Empty values: "".
func NearestString(values []string, s string) string {
	best, bestD := "", math.MaxInt
	for _, v := range values {
		if strings.EqualFold(v, s) {
			return v
		}
		if d := editDistance(strings.ToLower(v), strings.ToLower(s)); d < bestD {
			best, bestD = v, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(rb)]
}

// asMap reads a map value as a plan's JSON gives it (map[string]any), or as another decoder
// does: any map with string keys (a store's bson.M, map[string]string). A string holding JSON
// is not a map.
func asMap(v any) (map[string]any, bool) {
	if m, ok := v.(map[string]any); ok {
		return m, true
	}
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Map || rv.Type().Key().Kind() != reflect.String {
		return nil, false
	}
	m := make(map[string]any, rv.Len())
	for it := rv.MapRange(); it.Next(); {
		m[it.Key().String()] = it.Value().Interface()
	}
	return m, true
}

// asList reads a list value as a plan's JSON gives it ([]any), or as another decoder does: any
// slice (a store's bson.A, []string).
func asList(v any) ([]any, bool) {
	if l, ok := v.([]any); ok {
		return l, true
	}
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Slice || rv.Type().Elem().Kind() == reflect.Uint8 { // []byte is not a list
		return nil, false
	}
	l := make([]any, rv.Len())
	for i := range l {
		l[i] = rv.Index(i).Interface()
	}
	return l, true
}

// Number reads a number as a plan's JSON gives it (float64), or as Go code does.
func Number(v any) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, true
	case float32:
		return float64(x), true
	case int:
		return float64(x), true
	case int64:
		return float64(x), true
	case int32:
		return float64(x), true
	case json.Number:
		f, err := x.Float64()
		return f, err == nil
	case string:
		// Terraform converts "512" to a number attribute's 512; a plan's attributes have numbers,
		// but a caller may pass what a user typed.
		f, err := strconv.ParseFloat(strings.TrimSpace(x), 64)
		return f, err == nil
	}
	return 0, false
}

func formatNumber(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

func formatValue(v any) string {
	if f, ok := Number(v); ok { // also "512": a variable's string that terraform makes a number
		return formatNumber(f)
	}
	if s, ok := v.(string); ok {
		return strconv.Quote(s)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}
