package cli

import (
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/kloud-dev/kloud/provider"
)

// printConstraints shows a provider's constraints vocabulary in `kloud provider describe`: which
// attribute of its machine resource carries each, and what is allowed.
func printConstraints(w io.Writer, vocab []provider.Constraint) {
	if len(vocab) == 0 {
		return
	}
	fmt.Fprintf(w, "  constraints (checked when a stack is planned):\n")
	tw := newTable(w, "    CONSTRAINT", "ATTRIBUTE", "TYPE", "ALLOWED", "CONFLICTS", "DESCRIPTION")
	for _, c := range vocab {
		attr := c.Attribute
		if attr == "" {
			attr = "(fixed)"
		}
		tw.row("    "+c.Name, attr, c.Type, constraintAllowed(c), strings.Join(c.Conflicts, ","), c.Description)
	}
	tw.flush()
}

func constraintAllowed(c provider.Constraint) string {
	if len(c.Values) > 0 {
		return strings.Join(c.Values, "|")
	}
	num := func(f *float64) string { return strconv.FormatFloat(*f, 'f', -1, 64) }
	unit := ""
	if c.Unit != "" {
		unit = " " + c.Unit
	}
	switch {
	case c.Min != nil && c.Max != nil:
		return num(c.Min) + ".." + num(c.Max) + unit
	case c.Min != nil:
		return ">= " + num(c.Min) + unit
	case c.Max != nil:
		return "<= " + num(c.Max) + unit
	}
	return ""
}
