package tfsandbox_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/terraformer/tfsandbox"
)

// TestPTY: a sandbox opens pseudo-terminals only with Config.PTY, and then its own (a terminal
// opened inside is number 0 of a fresh devpts, as the sandbox's user).
func TestPTY(t *testing.T) {
	testutil.RequireRoot(t)
	script := testutil.RequireBinary(t, "script") // util-linux: runs a command on a new pty
	run := func(pty bool) (string, error) {
		env, err := tfsandbox.Config{Program: script, PTY: pty}.Env("pty-test")
		if err != nil {
			t.Fatal(err)
		}
		// This test binary is the launcher (TestMain calls MaybeRun); script gets the arguments.
		cmd := exec.Command(os.Args[0], "-q", "-e", "-c", "tty; id -u", "/dev/null")
		cmd.Env = []string{"PATH=/usr/bin:/bin"}
		for k, v := range env {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		out, err := cmd.CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	out, err := run(true)
	if err != nil || !strings.Contains(out, "/dev/pts/0") || !strings.Contains(out, "65534") {
		t.Fatalf("with PTY: %v: %q, want /dev/pts/0 as uid 65534", err, out)
	}
	if out, err := run(false); err == nil {
		t.Fatalf("without PTY a terminal opened: %q", out)
	} else {
		t.Logf("without PTY, refused as it should: %v: %s", err, out)
	}
}
