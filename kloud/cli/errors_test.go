package cli_test

import (
	"bytes"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/kloud/cli"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/dummy"
)

const flagsHint = "see --help"

// TestErrorsPointAtTheProblem (issue 18 §4): "see --help for the expected flags" follows only
// errors of the command line (a malformed username), not content errors (a password too short,
// a template's syntax, a template that declares no machine); and --url at something that is
// not kloud says so instead of WebSocket's status code.
func TestErrorsPointAtTheProblem(t *testing.T) {
	t.Parallel()
	reg := provider.NewRegistry()
	reg.Register(dummy.New(dummy.Options{Dir: filepath.Join(t.TempDir(), "machines")}))
	_, run, must := startKloud(t, kloudtest.Options{Providers: reg})
	dir := t.TempDir()
	write := func(name, content string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}

	// The command line's problem: the hint.
	if code, _, stderr := run("user", "add", "Bad_Name"); code == 0 || !strings.Contains(stderr, "username") || !strings.Contains(stderr, flagsHint) {
		t.Errorf("user add Bad_Name: exit %d: %s", code, stderr)
	}
	// Content: what is wrong with it, and no hint.
	short := write("short", "abc\n")
	if code, _, stderr := run("user", "add", "bob", "--password-file", short); code == 0 || !strings.Contains(stderr, "at least") || strings.Contains(stderr, flagsHint) {
		t.Errorf("user add with a short password: exit %d: %s", code, stderr)
	}
	must(run("user", "add", "alice", "--team", model.DefaultTeam))
	bad := write("bad.tf", "resource \"terraform_data\" \"vm\" {\n  count = \n}\n")
	if code, _, stderr := run("template", "create", "--title", "broken", "--file", bad); code == 0 || !strings.Contains(stderr, "bad.tf:") || strings.Contains(stderr, flagsHint) {
		t.Errorf("template create with a syntax error: exit %d: %s", code, stderr)
	}

	// --url at an HTTP server that is not kloud.
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Server", "not-kloud/1.0")
		http.NotFound(w, r)
	}))
	t.Cleanup(web.Close)
	var out, errOut bytes.Buffer
	code := cli.Run(t.Context(), []string{"stack", "list", "--url", web.URL, "--data-dir", dir, "--key", write("k", "x")}, &out, &errOut)
	stderr := errOut.String()
	t.Logf("stack list --url %s:\n%s", web.URL, stderr)
	for _, want := range []string{"nothing speaking kite answers at " + web.URL, "not-kloud/1.0", "404 Not Found", "--url"} {
		if code == 0 || !strings.Contains(stderr, want) {
			t.Errorf("stack list --url %s: exit %d, no %q in:\n%s", web.URL, code, want, stderr)
		}
	}
	if strings.Contains(strings.ReplaceAll(stderr, web.URL, ""), "101") { // not the URL's port (ci66: :44101)
		t.Errorf("stack list --url %s still talks of status 101:\n%s", web.URL, stderr)
	}

	// --url at something that does not even speak HTTP.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("SSH-2.0-OpenSSH_9.2\r\n"))
			c.Close()
		}
	}()
	out.Reset()
	errOut.Reset()
	url := "http://" + ln.Addr().String()
	code = cli.Run(t.Context(), []string{"stack", "list", "--url", url, "--data-dir", dir, "--key", write("k", "x")}, &out, &errOut)
	if stderr := errOut.String(); code == 0 || !strings.Contains(stderr, "connect to kloud at "+url) || !strings.Contains(stderr, "is --url (or KLOUD_URL) kloud's address?") {
		t.Errorf("stack list --url %s (not HTTP): exit %d:\n%s", url, code, stderr)
	}
}
