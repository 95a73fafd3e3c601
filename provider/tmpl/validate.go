package tmpl

import (
	"errors"
	"fmt"
)

// Validate applies kloud's rules to the machine resources of the template. machines maps each
// machine resource type to its user data attribute ("name" or "name.key"; "" when the provider
// delivers its agent without cloud-init), as provider.Provider's ResourceType and UserDataAttr.
//
// Rules:
//   - a machine resource may have count but not for_each: kloud labels machines name.N and
//     hands each its own user data by count.index;
//   - a machine's user data, when set, must be a literal string or heredoc: kloud embeds it in
//     the cloud-init it renders and cannot evaluate expressions.
//
// Problems are joined with errors.Join, each naming file:line.
func (c *Config) Validate(machines map[string]string) error {
	var errs []error
	for _, r := range c.resources {
		attr, ok := machines[r.Type]
		if !ok {
			continue
		}
		where := fmt.Sprintf("%s:%d: resource %q %q", r.File, r.Line, r.Type, r.Name)
		if r.ForEach {
			errs = append(errs, fmt.Errorf("%s: for_each is not supported on machine resources; use count for machine resources", where))
		}
		if attr == "" {
			continue
		}
		p, err := parseAttrPath(attr)
		if err != nil {
			errs = append(errs, fmt.Errorf("machine type %q: %w", r.Type, err))
			continue
		}
		a, item, isObject := lookupAttr(r.block.Body, p)
		switch {
		case a == nil:
			continue
		case p.key != "" && !isObject:
			errs = append(errs, fmt.Errorf("%s: %s must be an object ({ ... }) with %s a literal string, so kloud can add its cloud-init", where, p.attr, p.key))
			continue
		case p.key != "" && item == nil:
			continue
		}
		if _, ok, _ := c.LiteralString(r.Type, r.Name, attr); !ok {
			errs = append(errs, fmt.Errorf("%s: %s must be a literal string or heredoc without interpolation: kloud wraps it in the machine's cloud-init and cannot evaluate expressions", where, p))
		}
	}
	return errors.Join(errs...)
}
