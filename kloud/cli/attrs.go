package cli

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"unicode/utf8"
)

// attrs is a planned machine's attributes on one line of a table: those the template sets
// (configured; every one when kloud does not say, as before it did), each value on one line
// (valueText). input/output (terraform_data's user script and its copy) are left out unless
// the template sets them.
func attrs(m map[string]any, configured []string) string {
	keys := configured
	if len(keys) == 0 {
		for k := range m {
			if k != "input" && k != "output" && k != "user_data" {
				keys = append(keys, k)
			}
		}
	}
	keys = slices.Clone(keys)
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		v, ok := m[k]
		if !ok || v == nil {
			continue
		}
		parts = append(parts, k+"="+valueText(v))
	}
	return strings.Join(parts, " ")
}

// printAttributes prints a machine's attributes one a line, each value on it (valueText: kloud's
// tags as tags={kloud_machine=..., ...}, not the JSON text the state keeps); empty ones (null,
// "", [], {}) are left out.
func printAttributes(g *globals, m map[string]any) {
	keys := make([]string, 0, len(m))
	for k, v := range m {
		switch x := v.(type) {
		case nil:
			continue
		case string:
			if x == "" {
				continue
			}
		case []any:
			if len(x) == 0 {
				continue
			}
		case map[string]any:
			if len(x) == 0 {
				continue
			}
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return
	}
	sort.Strings(keys)
	fmt.Fprintln(g.stdout, "attributes:")
	tw := &table{tw: tabwriter.NewWriter(g.stdout, 0, 0, 2, ' ', 0)} // no header
	for _, k := range keys {
		tw.row("  "+k, valueText(m[k]))
	}
	tw.flush()
}

// maxValue is the longest value attrs shows whole (in runes).
const maxValue = 60

// valueText is a value on one line: a string of several lines as "(N lines)", a long one cut
// with "…", a JSON object in a string (kloud's tags as the state has them) and maps as
// {k=v, ...}, lists as [a, b].
func valueText(v any) string {
	switch x := v.(type) {
	case string:
		if strings.HasPrefix(x, "{") {
			var m map[string]any
			if json.Unmarshal([]byte(x), &m) == nil {
				return valueText(m)
			}
		}
		if n := strings.Count(strings.TrimRight(x, "\n"), "\n"); n > 0 {
			return fmt.Sprintf("(%d lines)", n+1)
		}
		if utf8.RuneCountInString(x) > maxValue {
			return string([]rune(x)[:maxValue-1]) + "…"
		}
		return x
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		parts := make([]string, 0, len(keys))
		for _, k := range keys {
			if x[k] != nil {
				parts = append(parts, k+"="+valueText(x[k]))
			}
		}
		return "{" + strings.Join(parts, ", ") + "}"
	case []any:
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = valueText(e)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	}
	return fmt.Sprint(v)
}
