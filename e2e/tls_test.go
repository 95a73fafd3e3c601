package e2e

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
)

// TestTLS serves kloud with a certificate for 127.0.0.1 signed by a CA the test makes (no
// public CA trusts it): the CLI works with --ca-cert (KLOUD_CA_CERT) and without it fails
// naming the unknown authority and the flag; plain http is refused; answers carry HSTS; the
// session cookie is Secure; the terraformer kloud starts serves https; and a dummy machine's
// klient, given the CA by its user data, downloads itself and registers over wss.
func TestTLS(t *testing.T) {
	parallel(t)
	testutil.RequireBinary(t, "terraform")
	testutil.RequireBinary(t, "curl")
	files := testutil.TestTLS(t)
	e := &env{t: t, dir: t.TempDir(), addr: testutil.FreeLoopback(t), tls: &files}
	e.start()
	t.Cleanup(e.cleanup)
	if out := e.kloudOut.String(); !strings.Contains(out, "terraformer: https://") {
		t.Errorf("the terraformer kloud starts does not serve https:\n%s", out)
	}

	// Plain http on the same port is refused.
	resp, err := http.Get("http://" + e.addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "HTTPS") {
		t.Errorf("plain http: %s %q, want 400 naming HTTPS", resp.Status, body)
	}

	// HSTS on every answer.
	hc := e.httpClient()
	resp, err = hc.Get(e.url() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if h := resp.Header.Get("Strict-Transport-Security"); !strings.HasPrefix(h, "max-age=") {
		t.Errorf("Strict-Transport-Security: %q", h)
	}

	// The CLI without the CA: a clear error; with an http:// URL: a hint at https.
	cli := func(url string, args ...string) (string, error) {
		cmd := exec.Command(filepath.Join(bin, "kloud"), args...)
		cmd.Env = append(os.Environ(), "KLOUD_URL="+url, "KLOUD_DATA_DIR="+e.dir)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := cli(e.url(), "user", "list")
	if err == nil || !strings.Contains(out, "certificate signed by unknown authority") || !strings.Contains(out, "--ca-cert") {
		t.Errorf("CLI without the CA: err %v:\n%s", err, out)
	}
	out, err = cli("http://"+e.addr, "user", "list", "--ca-cert", files.CA)
	if err == nil || !strings.Contains(out, "https://"+e.addr) {
		t.Errorf("CLI with an http URL: err %v:\n%s", err, out)
	}
	if out := e.run("user", "list"); !strings.Contains(out, "admin") {
		t.Errorf("user list with the CA:\n%s", out)
	}

	// With it, everything works: a user with a password logs in; the cookie is Secure.
	pw := filepath.Join(t.TempDir(), "pw")
	os.WriteFile(pw, []byte("correct horse battery\n"), 0o600)
	e.run("user", "add", "carol", "--team", "default", "--password-file", pw)
	b, _ := json.Marshal(map[string]string{"username": "carol", "password": "correct horse battery"})
	resp, err = hc.Post(e.url()+"/api/login", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var secure bool
	for _, c := range resp.Cookies() {
		secure = secure || c.Secure
		if !c.Secure {
			t.Errorf("cookie %s is not Secure", c.Name)
		}
	}
	if resp.StatusCode != http.StatusOK || !secure {
		t.Errorf("login: %s, cookies %v", resp.Status, resp.Cookies())
	}

	// A machine's klient registers over wss (the server speaks nothing else).
	e.alice()
	tid := e.template(`
resource "terraform_data" "vm" {
  input = "#!/bin/bash\necho hello over tls"
}
`)
	sid := e.createStack(tid)
	e.apply(sid)
	m := e.machines(sid)["vm"]
	if m.State != "Running" || m.Agent.Status != "connected" {
		t.Fatalf("machine: %+v", m)
	}
	run, err := os.ReadFile(filepath.Join(e.dir, "machines", sid, "vm", "var/lib/kloud/run-klient.sh"))
	if err != nil || !strings.Contains(string(run), "--ca-cert") || !strings.Contains(string(run), "https://") {
		t.Errorf("klient's command line (err %v): %s", err, run)
	}
	e.run("stack", "destroy", sid)
}

// TestTLSPlugin: a provider plugin kloud launches reaches a kloud that serves TLS only: it dials
// wss on loopback, trusting kloud's CA (KLOUD_PLUGIN_CA) and checking the certificate against
// the public URL's host (KLOUD_PLUGIN_TLS_SERVER_NAME), and registers.
func TestTLSPlugin(t *testing.T) {
	parallel(t)
	testutil.RequireRoot(t) // the plugin sandbox (and the launcher's uid change) need root
	testutil.RequireBinary(t, "terraform")
	files := testutil.TestTLS(t)
	e := &env{t: t, dir: t.TempDir(), addr: testutil.FreeLoopback(t), noDummy: true, tls: &files}
	e.start()
	t.Cleanup(e.cleanup)
	out := e.run("provider", "install", testPluginBin(t), "--name", "tlsplug", "--wait", "60s")
	if !strings.Contains(out, "provider tlsplug: connected") {
		t.Fatalf("install did not report the plugin connected:\n%s\nkloud:\n%s", out, e.kloudOut)
	}
}
