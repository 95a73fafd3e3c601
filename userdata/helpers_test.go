package userdata

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/kloud-dev/kloud/internal/testutil"
)

const testSHA = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// testKiteKey is a JWT-shaped string (header {"alg":"EdDSA","kid":"k1"}, payload with a jti).
const testKiteKey = "eyJhbGciOiJFZERTQSIsImtpZCI6ImsxIn0.eyJzdWIiOiJhbGljZSIsImp0aSI6IjZmMmE2YjJiIn0.c2lnbmF0dXJl"

func baseConfig() Config {
	return Config{
		Username:     "alice",
		Hostname:     "alice-vm-1",
		KiteKey:      testKiteKey,
		KontrolURL:   "http://10.200.0.1:7000/kite",
		KlientURL:    "http://10.200.0.1:7000/dl/klient",
		KlientSHA256: testSHA,
	}
}

// parseRendered checks the header and decodes a rendered cloud-config.
func parseRendered(t *testing.T, out []byte) map[string]any {
	t.Helper()
	if !bytes.HasPrefix(out, []byte("#cloud-config\n")) {
		t.Fatalf("output does not start with #cloud-config:\n%s", out)
	}
	var m map[string]any
	if err := yaml.Unmarshal(out, &m); err != nil {
		t.Fatalf("rendered YAML does not parse: %v\n%s", err, out)
	}
	return m
}

// writeFile returns the write_files entry whose path ends with suffix, or nil.
func writeFile(t *testing.T, cfg map[string]any, suffix string) map[string]any {
	t.Helper()
	files, _ := cfg["write_files"].([]any)
	for _, f := range files {
		m, _ := f.(map[string]any)
		if p, _ := m["path"].(string); strings.HasSuffix(p, suffix) {
			return m
		}
	}
	return nil
}

// provisionOf returns provision.sh from a rendered config and checks its syntax with bash -n.
func provisionOf(t *testing.T, out []byte) string {
	t.Helper()
	f := writeFile(t, parseRendered(t, out), ProvisionScriptPath)
	if f == nil {
		t.Fatalf("no %s in write_files", ProvisionScriptPath)
	}
	s, _ := f["content"].(string)
	bashSyntax(t, s)
	return s
}

// bashSyntax runs bash -n on a script.
func bashSyntax(t *testing.T, script string) {
	t.Helper()
	bash := testutil.RequireBinary(t, "bash")
	p := filepath.Join(t.TempDir(), "script.sh")
	if err := os.WriteFile(p, []byte(script), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bash, "-n", p).CombinedOutput(); err != nil {
		t.Fatalf("bash -n: %v\n%s\nscript:\n%s", err, out, script)
	}
}

// cloudInitSchema validates a rendered config with the host's cloud-init (schema only).
func cloudInitSchema(t *testing.T, out []byte) {
	t.Helper()
	ci := testutil.RequireBinary(t, "cloud-init")
	p := filepath.Join(t.TempDir(), "user-data")
	if err := os.WriteFile(p, out, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := exec.CommandContext(ctx, ci, "schema", "--config-file", p).CombinedOutput()
	if err != nil || !bytes.Contains(res, []byte("Valid cloud-config")) {
		t.Fatalf("cloud-init schema: %v\n%s\nconfig:\n%s", err, res, out)
	}
}
