package stackbuild

import "testing"

// A machine's address comes from its resource's attributes: a top-level attribute, or, for
// docker_container, its network_data.
func TestIPOf(t *testing.T) {
	t.Parallel()
	for want, attrs := range map[string]map[string]any{
		"10.200.0.5":  {"ip_address": "10.200.0.5"},
		"10.200.64.2": {"network_data": []any{map[string]any{"network_name": "kloud-machines", "ip_address": "10.200.64.2"}}},
		"":            {"network_data": []any{map[string]any{"ip_address": ""}}, "name": "x"},
	} {
		if got := IPOf(attrs); got != want {
			t.Errorf("IPOf(%v) = %q, want %q", attrs, got, want)
		}
	}
}
