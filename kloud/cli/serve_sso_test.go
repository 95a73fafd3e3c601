package cli_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/kloud/cli"
)

// TestServeSSOFlags: kloud serve refuses an incomplete single sign-on configuration before it
// starts anything, each time naming the flag to add or fix.
func TestServeSSOFlags(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--oidc-issuer", "https://id.example.com/"}, "needs --oidc-client-id"},
		{[]string{"--oidc-issuer", "https://id.example.com/", "--oidc-client-id", "kloud"}, "needs --oidc-client-secret-file"},
		{[]string{"--oidc-issuer", "https://id.example.com/", "--oidc-client-id", "kloud", "--oidc-client-secret-file", filepath.Join(dir, "missing")}, "--oidc-client-secret-file: open"},
		{[]string{"--oidc-issuer", "https://id.example.com/", "--oidc-client-id", "kloud", "--oidc-client-secret-file", empty}, "the first line is empty"},
		{[]string{"--oidc-client-id", "kloud"}, "need --oidc-issuer"},
	} {
		var out, errOut bytes.Buffer
		args := append([]string{"serve", "--data-dir", filepath.Join(dir, "data")}, c.args...)
		if code := cli.Run(t.Context(), args, &out, &errOut); code == 0 || !strings.Contains(errOut.String(), c.want) {
			t.Errorf("kloud %s: exit %d, stderr %q, want %q", strings.Join(c.args, " "), code, errOut.String(), c.want)
		}
		if _, err := os.Stat(filepath.Join(dir, "data")); err == nil {
			t.Fatalf("kloud %s made its data directory before refusing", strings.Join(c.args, " "))
		}
	}
}
