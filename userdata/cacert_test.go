package userdata

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
)

// TestCACert: a kloud whose certificate needs its own CA gives machines that CA: the cloud-config
// writes /etc/kloud/ca.pem (0644), the download trusts it (curl --cacert) and klient gets
// --ca-cert; the dummy's script writes it under the machine's root. Something that is no PEM
// certificate is refused.
func TestCACert(t *testing.T) {
	pem, err := os.ReadFile(testutil.TestTLS(t).CA)
	if err != nil {
		t.Fatal(err)
	}
	c := baseConfig()
	c.CACert = string(pem)
	out, err := Render(c)
	if err != nil {
		t.Fatal(err)
	}
	f := writeFile(t, parseRendered(t, out), CACertPath)
	if f == nil || f["content"] != string(pem) || f["permissions"] != "0644" {
		t.Fatalf("%s in write_files: %v", CACertPath, f)
	}
	prov := provisionOf(t, out)
	if !strings.Contains(prov, "--cacert "+CACertPath) || !strings.Contains(prov, "--ca-cert "+CACertPath) {
		t.Errorf("provision.sh does not use the CA:\n%s", prov)
	}
	if prov := provisionOf(t, mustRender(t, baseConfig())); strings.Contains(prov, "--cacert") || strings.Contains(prov, "--ca-cert") {
		t.Errorf("provision.sh without a CA names one:\n%s", prov)
	}
	root := t.TempDir()
	script, err := RenderScript(c, root)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(script), root+CACertPath) {
		t.Errorf("the script does not write %s under its root:\n%s", CACertPath, script)
	}
	c.CACert = "not a certificate"
	if _, err := Render(c); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "CA certificate") {
		t.Errorf("a CA that is no PEM certificate: %v", err)
	}
}

func mustRender(t *testing.T, c Config) []byte {
	t.Helper()
	out, err := Render(c)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
