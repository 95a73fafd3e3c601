package e2e

// `kloud machine ports close` (issue 18 §3) on a real local machine, through the CLI: a port
// opened --from team closes by its number; --from narrows a close to that rule; closing what is
// not open fails (exit status non-zero) saying what is open, and closes nothing. Needs root and
// the base image (skips loudly otherwise, fails under CI=true).

import (
	"strings"
	"testing"
)

func TestLocalPortsClose(t *testing.T) {
	parallel(t)
	e := newLocalEnv(t)
	e.alice()
	sid := e.createStack(e.template(localTemplate("dev", 1, "#!/bin/bash\ntrue")))
	e.apply(sid)
	ports := func(args ...string) (string, error) {
		return e.try(append([]string{"machine", "ports"}, args...)...)
	}
	must := func(args ...string) string {
		t.Helper()
		out, err := ports(args...)
		if err != nil {
			t.Fatalf("kloud machine ports %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	fails := func(what string, want []string, args ...string) {
		t.Helper()
		out, err := ports(args...)
		if err == nil {
			t.Fatalf("%s: exit 0, want a failure:\n%s", what, out)
		}
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Errorf("%s: %q does not say %q", what, out, w)
			}
		}
		if strings.Contains(out, "--help") {
			t.Errorf("%s: points at the flags, which are not the problem:\n%s", what, out)
		}
		t.Logf("%s: %s", what, out)
	}
	listed := func() string { return must("dev.0") }

	// Opened --from team, closed by its port.
	if out := must("open", "dev.0", "8000", "--from", "team"); !strings.Contains(out, "team") {
		t.Fatalf("open 8000 --from team:\n%s", out)
	}
	if out := must("close", "dev.0", "8000"); !strings.Contains(out, "no rules") {
		t.Fatalf("close 8000 after opening it --from team:\n%s", out)
	}
	if out := listed(); !strings.Contains(out, "no rules") {
		t.Fatalf("rules after close 8000:\n%s", out)
	}

	// Nothing open: the close fails and says so.
	fails("close 8000 with nothing open", []string{"machine dev.0 has no rule 8000 to close", "open: none"}, "close", "dev.0", "8000")

	// Only team open: --from any fails, listing it, and closes nothing; --from team closes it.
	must("open", "dev.0", "8000", "--from", "team")
	must("open", "dev.0", "53/udp")
	fails("close 8000 --from any with only team open", []string{"has no rule 8000 from any to close", "8000/tcp from team", "53/udp from any"},
		"close", "dev.0", "8000", "--from", "any")
	fails("close 8000/udp with only 8000/tcp open", []string{"has no rule 8000/udp to close"}, "close", "dev.0", "8000/udp")
	if out := listed(); !strings.Contains(out, "team") || !strings.Contains(out, "53") {
		t.Fatalf("rules after the refused closes:\n%s", out)
	}
	if out := must("close", "dev.0", "8000", "--from", "team"); strings.Contains(out, "team") || !strings.Contains(out, "53") {
		t.Fatalf("close 8000 --from team:\n%s", out)
	}
	if out := must("close", "dev.0", "53"); !strings.Contains(out, "no rules") {
		t.Fatalf("close 53:\n%s", out)
	}
	e.run("stack", "destroy", sid)
}
