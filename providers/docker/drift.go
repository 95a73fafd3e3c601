package docker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strconv"
	"strings"

	"github.com/moby/moby/client"

	"github.com/kloud-dev/kloud/provider"
)

// Drift: what the Docker Terraform provider reads back from the daemon must equal what the
// template says, or every plan of an unchanged stack shows a change. Two arguments kloud's
// machines may set do not round-trip as written:
//
//   - cpus (a string, ForceNew): the provider reads NanoCpus back through its own formatter
//     (nanoCPUsString), so cpus = "1" comes back as "1.0" and every plan replaces the machine.
//     ApplyTemplate writes the canonical string instead (the same number of CPUs: "1" → "1.0",
//     "2.50" → "2.5", 10 → "10."). A few values have no canonical string (the formatter rounds
//     them: 0.05 reads back as "0.1", 0.01 as "0.0"); those are refused with the nearest values
//     that hold, before terraform runs.
//   - memory_swap (an integer, MB, updated in place): when a template sets memory but not
//     memory_swap, the daemon sets it (twice the memory: Docker's default, swap as large as the
//     memory), the provider reads that back and the next plan wants to set it to null, an
//     in-place update. ApplyTemplate writes Docker's default explicitly, so the machine gets
//     exactly what it got before and the plan stays empty. On a daemon whose kernel has no swap
//     accounting (docker info: SwapLimit false) the daemon stores -1 whatever was asked, so
//     memory_swap is written as -1 there (the template's own value included: the host cannot
//     give it).
//
// The values come from the template's literal when it has one, else from the machine's planned
// attributes (an expression such as var.cpus or a count.index lookup). A resource whose value is
// neither (unknown until apply) is left as written.

// nanoCPUs parses a cpus value as the Docker provider does (docker/cli opts.ParseCPUs): a
// rational number of CPUs, in units of 1e-9.
func nanoCPUs(s string) (int64, error) {
	cpu, ok := new(big.Rat).SetString(strings.TrimSpace(s))
	if !ok {
		return 0, fmt.Errorf("cpus %q is not a number", s)
	}
	nano := cpu.Mul(cpu, big.NewRat(1e9, 1))
	if !nano.IsInt() {
		return 0, fmt.Errorf("cpus %q is too precise (at most 9 decimals)", s)
	}
	if nano.Sign() < 0 || !nano.Num().IsInt64() {
		return 0, fmt.Errorf("cpus %q is out of range", s)
	}
	return nano.Num().Int64(), nil
}

// nanoCPUsString formats NanoCpus exactly as the Docker provider reads them back into cpus
// (kreuzwerker/docker 4.6.0 nanoInt64ToDecimalString).
func nanoCPUsString(n int64) string {
	if n == 0 {
		return "0"
	}
	rat := new(big.Rat).SetFrac64(n, 1e9)
	str := rat.FloatString(9)
	if strings.Count(str, "0") == 9 {
		return rat.FloatString(1)
	}
	return strings.TrimRight(str, "0")
}

// canonicalCPUs returns the cpus string that the Docker provider reads back unchanged and that
// means the same number of CPUs as v (a string or a number); an error when v is not a valid
// cpus value or no string holds it (naming the nearest values that do).
func canonicalCPUs(v any) (string, error) {
	s, err := numberString(v)
	if err != nil {
		return "", fmt.Errorf("cpus: %w", err)
	}
	n, err := nanoCPUs(s)
	if err != nil {
		return "", err
	}
	c := nanoCPUsString(n)
	if back, err := nanoCPUs(c); err == nil && back == n {
		return c, nil
	}
	friendly := func(n int64) string { return strconv.FormatFloat(float64(n)/1e9, 'f', -1, 64) }
	lo, hi := stableCPUs(n, -1), stableCPUs(n, +1)
	near := friendly(hi)
	if lo > 0 {
		near = friendly(lo) + " or " + near
	}
	return "", fmt.Errorf("cpus = %q: the Docker Terraform provider reads it back as %q (another value), so every plan would replace the machine; use a value it keeps, e.g. %s", s, c, near)
}

// stableCPUs is the nearest multiple of 0.01 CPUs from n in direction dir (±1) whose canonical
// string holds; 0 when there is none below.
func stableCPUs(n int64, dir int64) int64 {
	const step = 1e7 // 0.01 CPUs
	m := n / step * step
	if dir > 0 {
		m += step
	}
	for ; m > 0; m += dir * step {
		if back, err := nanoCPUs(nanoCPUsString(m)); err == nil && back == m {
			return m
		}
	}
	return 0
}

// numberString turns a planned or literal value (string, number) into its decimal string.
func numberString(v any) (string, error) {
	switch v := v.(type) {
	case string:
		return v, nil
	case int:
		return strconv.Itoa(v), nil
	case int64:
		return strconv.FormatInt(v, 10), nil
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64), nil
	case json.Number:
		return v.String(), nil
	}
	return "", fmt.Errorf("%v (%T) is not a number or a string", v, v)
}

// intValue turns a planned or literal whole number into an int64.
func intValue(v any) (int64, error) {
	s, err := numberString(v)
	if err != nil {
		return 0, err
	}
	f, ok := new(big.Rat).SetString(s)
	if !ok || !f.IsInt() || !f.Num().IsInt64() {
		return 0, fmt.Errorf("%q is not a whole number", s)
	}
	return f.Num().Int64(), nil
}

// limitVars returns the per-machine values kloud writes for cpus (kind "cpus", strings) and
// memory_swap (kind "memory_swap", numbers) of resource res: ms are its machines in count order,
// lit its literal attributes, args the arguments the template writes, swapLimit the daemon's
// SwapLimit (asked only when the template writes memory). A kind is left out when the template
// does not need it or a machine's value is unknown (an expression without a planned value).
func limitVars(res string, lit map[string]any, args []string, ms []*provider.MachineSpec, swapLimit func() bool) (map[string][]any, error) {
	has := func(a string) bool { return slices.Contains(args, a) }
	value := func(m *provider.MachineSpec, attr string) (any, bool) {
		if v, ok := lit[attr]; ok {
			return v, true
		}
		v, ok := m.Attributes[attr]
		return v, ok && v != nil
	}
	out := map[string][]any{}
	var errs []error
	if has("cpus") {
		var vals []any
		for _, m := range ms {
			v, ok := value(m, "cpus")
			if !ok {
				vals = nil
				break
			}
			if zero(v) {
				vals = append(vals, "")
				continue
			}
			c, err := canonicalCPUs(v)
			if err != nil {
				errs = append(errs, fmt.Errorf("machine %s (%s.%s): %w", m.Label, ResourceType, res, err))
				continue
			}
			vals = append(vals, c)
		}
		if len(vals) == len(ms) {
			out["cpus"] = vals
		}
	}
	// memory_swap: Docker's default written out, unless the template's own value holds.
	if !has("memory") {
		return out, errors.Join(errs...)
	}
	if swapLimit := swapLimit(); !has("memory_swap") || !swapLimit {
		var vals []any
		for _, m := range ms {
			v, ok := value(m, "memory")
			if !ok {
				vals = nil
				break
			}
			mb, err := intValue(v)
			if err != nil || mb > maxMemoryMB {
				vals = nil // not a whole number, or beyond any host: the schema or the constraints refuse it
				break
			}
			switch {
			case mb <= 0:
				vals = append(vals, int64(0)) // no limit: nothing to write (0 is unset)
			case !swapLimit:
				vals = append(vals, int64(-1))
			default:
				vals = append(vals, 2*mb)
			}
		}
		if len(vals) == len(ms) {
			out["memory_swap"] = vals
		}
	}
	return out, errors.Join(errs...)
}

// maxMemoryMB bounds the memory limitVars doubles (1 PiB: beyond any daemon; twice it, in
// bytes, still fits an int64).
const maxMemoryMB = 1 << 30

// swapLimit reports whether the daemon's kernel accounts swap (docker info: SwapLimit); true
// when the daemon does not answer (Docker's default then applies).
func (d *Docker) swapLimit(ctx context.Context) bool {
	cli, err := d.Client()
	if err != nil {
		return true
	}
	res, err := cli.Info(ctx, client.InfoOptions{})
	if err != nil {
		d.log.Warn("docker provider: daemon info unavailable; assuming it accounts swap", "err", err)
		return true
	}
	return res.Info.SwapLimit
}
