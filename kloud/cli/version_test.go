package cli_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/internal/version"
	"github.com/kloud-dev/kloud/kloud/cli"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
)

// TestVersionCommand: `kloud version` prints the client's version and the server's (asked with
// kloud.version); with the server gone it still prints the client's, and says why the server's
// is missing.
func TestVersionCommand(t *testing.T) {
	t.Parallel()
	kloudDir := t.TempDir()
	e := kloudtest.Start(t, kloudtest.Options{DataDir: kloudDir})
	run := func(args ...string) (int, string, string) {
		t.Helper()
		var out, errOut bytes.Buffer
		code := cli.Run(t.Context(), append(args, "--url", e.URL, "--data-dir", kloudDir), &out, &errOut)
		return code, out.String(), errOut.String()
	}

	code, out, stderr := run("version")
	if code != 0 || out != "kloud "+version.Version+"\nserver "+version.Version+"\n" {
		t.Fatalf("version: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, stderr)
	}
	code, out, stderr = run("version", "--json")
	var v map[string]string
	if err := json.Unmarshal([]byte(out), &v); code != 0 || err != nil || v["client"] != version.Version || v["server"] != version.Version {
		t.Fatalf("version --json: exit %d (%v)\nstdout:\n%s\nstderr:\n%s", code, err, out, stderr)
	}

	e.Stop()
	code, out, stderr = run("version")
	if code != 0 || out != "kloud "+version.Version+"\n" || !strings.Contains(stderr, "server version unknown") || !strings.Contains(stderr, "cannot reach kloud") {
		t.Fatalf("version without a server: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, stderr)
	}
}
