package provider

import "slices"

// The Capability type, its constants and ErrUnsupported are in provider.go.

// Caps returns p's capabilities, sorted, with those Provider.MoreCaps adds at the moment, and
// bucket whenever Provider.Buckets is set (kloud serve gives it after construction). With
// Provider.Capabilities set, exactly those (a plugin proxy sets them from the plugin's
// handshake; an in-tree provider may set them to advertise less). Otherwise they are derived: start, stop and info always; consoleLog and resize if a
// machine built from an empty BaseMachine implements ConsoleLogger or Resizer; constraints (templateRules) if a
// stack built from an empty BaseStack implements ConstraintsValidator (TemplateValidator); bootstrap if the schema
// has a bootstrap part. A constructor that fails or panics on the empty Base* counts as not
// having the optional interfaces.
func (p *Provider) Caps() []Capability {
	var out []Capability
	if p.Capabilities != nil {
		out = slices.Clone(p.Capabilities)
	} else {
		out = p.derivedCaps()
	}
	if p.MoreCaps != nil {
		out = append(out, p.MoreCaps()...)
	}
	if p.Buckets != nil { // set after construction (kloud serve's S3 server): listed or not
		out = append(out, CapBucket)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// derivedCaps are the capabilities Caps derives when Provider.Capabilities is not set.
func (p *Provider) derivedCaps() []Capability {
	out := []Capability{CapStart, CapStop, CapInfo}
	if m := probe(func() (Machine, error) { return p.Machine(&BaseMachine{Provider: p}) }, p.Machine != nil); m != nil {
		if _, ok := m.(ConsoleLogger); ok {
			out = append(out, CapConsoleLog)
		}
		if _, ok := m.(Resizer); ok {
			out = append(out, CapResize)
		}
		if _, ok := m.(Snapshotter); ok {
			out = append(out, CapSnapshot)
		}
		if _, ok := m.(Firewaller); ok {
			out = append(out, CapFirewall)
		}
	}
	if st := probe(func() (Stack, error) { return p.Stack(&BaseStack{Provider: p}) }, p.Stack != nil); st != nil {
		if _, ok := st.(ConstraintsValidator); ok {
			out = append(out, CapConstraints)
		}
		if _, ok := st.(TemplateValidator); ok {
			out = append(out, CapTemplateRules) // templaterules.go
		}
	}
	if p.HasPart(PartBootstrap) {
		out = append(out, CapBootstrap)
	}
	if p.Inventory != nil {
		out = append(out, CapResources) // resources.go
	}
	return out
}

// Can reports whether p has capability c.
func (p *Provider) Can(c Capability) bool { return slices.Contains(p.Caps(), c) }

// probe calls a Base* constructor, turning a panic or an error into the zero value.
func probe[T any](mk func() (T, error), ok bool) (v T) {
	if !ok {
		return v
	}
	defer func() {
		if recover() != nil {
			var zero T
			v = zero
		}
	}()
	v, err := mk()
	if err != nil {
		var zero T
		return zero
	}
	return v
}
