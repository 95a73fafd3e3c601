package e2e

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
)

// TestJSONLogs runs kloud serve with --log-format json (and --log-level debug): every line
// kloud and the terraformer it starts log is a JSON object; a failing call (a member's user.add)
// has lines that all carry the same requestId, user alice and method user.add; a failed login
// (HTTP) has a line carrying the request id kloud sent back as X-Request-Id and its method.
func TestJSONLogs(t *testing.T) {
	parallel(t)
	e := newEnv(t, "--log-format", "json", "--log-level", "debug")
	e.alice()
	if out, err := e.try("user", "add", "mallory"); err == nil {
		t.Fatalf("a member's user add succeeded:\n%s", out)
	}
	body := bytes.NewReader([]byte(`{"username":"alice","password":"not her password"}`))
	resp, err := http.Post(e.url()+"/api/login", "application/json", body)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	loginID := resp.Header.Get("X-Request-Id")

	// kloud's output reaches the test through a pipe: wait for the lines of both requests.
	testutil.Eventually(t, 10*time.Second, func() bool {
		out := e.kloudOut.String()
		return strings.Contains(out, `"msg":"login failed"`) && strings.Contains(out, `"msg":"call failed"`)
	}, "kloud did not log the failed login and call:\n%s", e.kloudOut)
	var lines []map[string]any
	loginSeen, tfJSON := false, false
	for _, line := range strings.Split(e.kloudOut.String(), "\n") {
		raw, fromTF := strings.CutPrefix(line, "terraformer: ")
		if !strings.HasPrefix(raw, "{") {
			continue // kloud serve's own messages on stdout ("listening on", "admin key: …")
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(raw), &m); err != nil {
			t.Errorf("not JSON: %q: %v", line, err)
			continue
		}
		if fromTF {
			tfJSON = true
		}
		lines = append(lines, m)
		if m["msg"] == "login failed" {
			loginSeen = true
			if m["requestId"] != loginID || loginID == "" || m["method"] != "POST /api/login" {
				t.Errorf("login failed line %v, X-Request-Id %q", m, loginID)
			}
		}
	}
	// The failing call: its "call failed" line names it; every line of its id is about it.
	var id string
	for _, m := range lines {
		if m["msg"] == "call failed" && m["method"] == "user.add" {
			id, _ = m["requestId"].(string)
			if m["user"] != "alice" || m["code"] != float64(-32002) {
				t.Errorf("call failed line: %v", m)
			}
		}
	}
	var call []map[string]any
	for _, m := range lines {
		if id != "" && m["requestId"] == id {
			call = append(call, m)
			if m["user"] != "alice" || m["method"] != "user.add" {
				t.Errorf("a line of the call: %v", m)
			}
		}
	}
	if len(call) < 2 {
		t.Errorf("the failing call's lines (want 2 or more with its requestId %q): %v", id, call)
	}
	if !loginSeen || !tfJSON {
		t.Errorf("login failed line seen %v, terraformer JSON lines seen %v:\n%s", loginSeen, tfJSON, e.kloudOut)
	}
	if out, err := e.try("serve", "--log-format", "yaml"); err == nil || !strings.Contains(out, "want text or json") {
		t.Errorf("--log-format yaml: err %v:\n%s", err, out)
	}
	for _, b := range []string{"terraformer", "klient"} {
		out, err := exec.Command(filepath.Join(bin, b), "--log-format", "yaml").CombinedOutput()
		if err == nil || !strings.Contains(string(out), "want text or json") {
			t.Errorf("%s --log-format yaml: err %v: %s", b, err, out)
		}
	}
}
