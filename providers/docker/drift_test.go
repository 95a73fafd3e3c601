package docker

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/provider/tmpl"
)

// The cpus string kloud writes is what the Docker provider reads back, for the same number of
// CPUs; values the provider's formatter rounds are refused with values that hold.
func TestCanonicalCPUs(t *testing.T) {
	t.Parallel()
	ok := map[any]string{
		"1": "1.0", "1.0": "1.0", "1.00": "1.0", " 2 ": "2.0", "0.5": "0.5", "1.5": "1.5", "2.250": "2.25",
		"0.25": "0.25", "10": "10.", "20": "20.", "100": "100.", "10.5": "10.5", "1.05": "1.05", "3/2": "1.5",
		"0": "0", int64(4): "4.0", float64(1.5): "1.5", 2: "2.0", json.Number("0.75"): "0.75",
	}
	for in, want := range ok {
		got, err := canonicalCPUs(in)
		if err != nil || got != want {
			t.Errorf("canonicalCPUs(%#v) = %q, %v; want %q", in, got, err, want)
			continue
		}
		// It holds: formatting what it parses to gives it back, and it means the same CPUs.
		n, err := nanoCPUs(got)
		if err != nil || nanoCPUsString(n) != got {
			t.Errorf("%q does not round-trip: %d %v", got, n, err)
		}
		s, _ := numberString(in)
		if m, _ := nanoCPUs(s); m != n {
			t.Errorf("canonicalCPUs(%#v) = %q: %d CPUs×1e9, want %d", in, got, n, m)
		}
	}
	// The provider's own examples (its helpers_test.go).
	for n, want := range map[int64]string{0: "0", 1e9: "1.0", 1.5e9: "1.5", 2e9: "2.0", 2.25e9: "2.25"} {
		if got := nanoCPUsString(n); got != want {
			t.Errorf("nanoCPUsString(%d) = %q, want %q", n, got, want)
		}
	}
	bad := map[string]string{
		"0.05":         `reads it back as "0.1"`,
		"0.01":         "e.g. 0.1", // read back as "0.0": no CPUs at all
		"10.05":        "e.g. 10 or 10.1",
		"x":            "not a number",
		"0.0000000001": "too precise",
		"-1":           "out of range",
		"1e30":         "out of range",
	}
	for in, want := range bad {
		_, err := canonicalCPUs(in)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("canonicalCPUs(%q) = %v; want an error naming %q", in, err, want)
		}
	}
	if _, err := canonicalCPUs([]string{"1"}); err == nil {
		t.Error("canonicalCPUs of a list: no error")
	}
}

// limitVars: cpus canonical per machine (the literal first, else the planned value), Docker's
// memory_swap default written out (or -1 without swap accounting), nothing for what the template
// does not write or what is unknown.
func TestLimitVars(t *testing.T) {
	t.Parallel()
	ms := func(attrs ...map[string]any) []*provider.MachineSpec {
		var out []*provider.MachineSpec
		for i, a := range attrs {
			out = append(out, &provider.MachineSpec{Label: "vm." + string(rune('0'+i)), Attributes: a})
		}
		return out
	}
	cases := []struct {
		name      string
		lit       map[string]any
		args      []string
		ms        []*provider.MachineSpec
		swapLimit bool
		want      map[string][]any
		err       string
	}{
		{"literal cpus and memory", map[string]any{"cpus": "1", "memory": int64(512)}, []string{"cpus", "memory"}, ms(nil, nil), true,
			map[string][]any{"cpus": {"1.0", "1.0"}, "memory_swap": {int64(1024), int64(1024)}}, ""},
		{"planned values (expressions), literal ignored when absent", nil, []string{"cpus", "memory"},
			ms(map[string]any{"cpus": "1", "memory": float64(256)}, map[string]any{"cpus": "2.50", "memory": json.Number("300")}), true,
			map[string][]any{"cpus": {"1.0", "2.5"}, "memory_swap": {int64(512), int64(600)}}, ""},
		{"the template's memory_swap holds", map[string]any{"memory": int64(512), "memory_swap": int64(2048)}, []string{"memory", "memory_swap"}, ms(nil), true,
			map[string][]any{}, ""},
		{"no swap accounting: -1", map[string]any{"memory": int64(512), "memory_swap": int64(2048)}, []string{"memory", "memory_swap"}, ms(nil), false,
			map[string][]any{"memory_swap": {int64(-1)}}, ""},
		{"unknown planned value: left as written", nil, []string{"cpus", "memory"}, ms(map[string]any{"cpus": "1", "memory": int64(64)}, map[string]any{}), true,
			map[string][]any{}, ""},
		{"unset cpus and memory for one machine", nil, []string{"cpus", "memory"}, ms(map[string]any{"cpus": "", "memory": int64(0)}, map[string]any{"cpus": "1", "memory": int64(64)}), true,
			map[string][]any{"cpus": {"", "1.0"}, "memory_swap": {int64(0), int64(128)}}, ""},
		{"memory beyond any host: left to the constraints", nil, []string{"memory"}, ms(map[string]any{"memory": float64(1 << 62)}), true, map[string][]any{}, ""},
		{"not written: nothing", map[string]any{}, nil, ms(map[string]any{"cpus": "1.0", "memory_swap": int64(0)}), true, map[string][]any{}, ""},
		{"a cpus value that cannot hold", nil, []string{"cpus"}, ms(map[string]any{"cpus": "0.05"}), true, nil, "machine vm.0 (docker_container.vm): cpus = \"0.05\""},
	}
	for _, c := range cases {
		asked := false
		got, err := limitVars("vm", c.lit, c.args, c.ms, func() bool { asked = true; return c.swapLimit })
		if asked && !slices.Contains(c.args, "memory") {
			t.Errorf("%s: the daemon's SwapLimit asked for a template without memory", c.name)
		}
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: error %v, want %q", c.name, err, c.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: %v %v, want %v", c.name, got, err, c.want)
		}
	}
}

// The rewrite the values go into: cpus replaced, memory_swap added, with per-machine variables.
func TestLimitVarsRewrite(t *testing.T) {
	t.Parallel()
	cfg, err := tmpl.Parse(map[string][]byte{"main.tf": []byte(`resource "docker_container" "vm" {
  count  = 2
  name   = "vm"
  image  = "kloud"
  memory = 512
  cpus   = "1"
}
`)})
	if err != nil {
		t.Fatal(err)
	}
	args := resourceArgs(cfg, "vm")
	lv, err := limitVars("vm", cfg.LiteralAttrs(ResourceType, "vm"), args, []*provider.MachineSpec{{}, {}}, func() bool { return true })
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"cpus", "memory_swap"} {
		if err := cfg.SetUserData(ResourceType, "vm", kind, genVar(kind, "vm")); err != nil {
			t.Fatal(err)
		}
	}
	src := string(cfg.Files()["main.tf"])
	if !strings.Contains(src, `cpus   = var.kloud_docker_cpus_vm[count.index]`) || !strings.Contains(src, "memory_swap = var.kloud_docker_memory_swap_vm[count.index]") {
		t.Errorf("rewritten template:\n%s", src)
	}
	if !reflect.DeepEqual(lv["cpus"], []any{"1.0", "1.0"}) {
		t.Errorf("cpus %v", lv["cpus"])
	}
}
