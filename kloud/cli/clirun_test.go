package cli_test

import (
	"bytes"
	"testing"

	"github.com/kloud-dev/kloud/kloud/cli"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
)

// startKloud starts a kloud for a CLI test (o.DataDir: a new temporary directory if empty) and
// returns it with run, which runs the kloud CLI against it with its data dir, so as its
// administrator unless the arguments add --key; and must, which fails the test unless such a
// command exited 0, and returns its standard output.
func startKloud(t *testing.T, o kloudtest.Options) (e *kloudtest.Env, run func(args ...string) (int, string, string), must func(code int, stdout, stderr string) string) {
	t.Helper()
	if o.DataDir == "" {
		o.DataDir = t.TempDir()
	}
	e = kloudtest.Start(t, o)
	run = func(args ...string) (int, string, string) {
		t.Helper()
		var out, errOut bytes.Buffer
		code := cli.Run(t.Context(), append(args, "--url", e.URL, "--data-dir", o.DataDir), &out, &errOut)
		return code, out.String(), errOut.String()
	}
	must = func(code int, stdout, stderr string) string {
		t.Helper()
		if code != 0 {
			t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
		}
		return stdout
	}
	return e, run, must
}
