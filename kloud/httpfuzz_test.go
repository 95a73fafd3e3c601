package kloud_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/kloud/kloudhttp"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
)

// FuzzHTTP sends hostile bodies and credentials to a real kloud's HTTP routes that decode what a
// client sends: the login body (JSON), and a bearer token or session cookie on the routes that
// authenticate one (session, logout, terminal sessions, metrics, backup). Whatever it gets, kloud
// answers a client error (4xx, a JSON {"error": ...} body), never a server error; no fuzzed
// credential opens an owner's route (the only valid one among the seeds is a member's, alice);
// and kloud still answers afterwards.
func FuzzHTTP(f *testing.F) {
	e := kloudtest.Start(f, kloudtest.Options{})
	key, _, err := e.Server.Kontrol.CreateKey("alice", "")
	if err != nil {
		f.Fatal(err)
	}
	type route struct {
		method, path string
		how          string // "body", "bearer" or "cookie"
		ownersOnly   bool
	}
	routes := []route{
		{"POST", "/api/login", "body", false},
		{"GET", "/api/session", "cookie", false},
		{"GET", "/api/session", "bearer", false},
		{"POST", "/api/logout", "cookie", false},
		{"GET", "/api/machines/m-1/sessions", "bearer", false},
		{"GET", "/metrics", "bearer", true},
		{"GET", "/api/admin/backup", "bearer", true},
		{"GET", "/api/machines/m-1/ssh/hostkey", "cookie", false},
	}
	for _, s := range []string{
		`{"username":"admin","password":"x"}`, `{"username":"a","password":"b","extra":1}`, `{"username":1}`,
		`{"username":"` + strings.Repeat("a", 5000) + `","password":"x"}`, `[`, `null`, ``, "\xff\xfe",
	} {
		f.Add(uint8(0), []byte(s))
	}
	for _, s := range []string{
		key, key + "x", strings.ToUpper(key), "Bearer " + key, `eyJhbGciOiJub25lIn0.eyJzdWIiOiJhZG1pbiJ9.`,
		`eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhZG1pbiIsImFkbWluIjp0cnVlfQ.c2ln`, "", "a.b.c", "\x00",
	} {
		for i := 1; i < len(routes); i++ {
			f.Add(uint8(i), []byte(s))
		}
	}
	f.Fuzz(func(t *testing.T, which uint8, data []byte) {
		rt := routes[int(which)%len(routes)]
		var body io.Reader
		req, err := http.NewRequestWithContext(t.Context(), rt.method, e.URL+rt.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		switch rt.how {
		case "body":
			body = bytes.NewReader(data)
			req.Body = io.NopCloser(body)
			req.ContentLength = int64(len(data))
			req.Header.Set("Content-Type", "application/json")
		case "bearer":
			req.Header.Set("Authorization", "Bearer "+string(data))
		case "cookie":
			req.Header.Set("Cookie", kloudhttp.SessionCookie+"="+string(data))
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			if strings.Contains(err.Error(), "invalid header") || strings.Contains(err.Error(), "net/http:") {
				t.Skip("net/http does not send this header:", err)
			}
			t.Fatalf("%s %s (%s %q): %v", rt.method, rt.path, rt.how, data, err)
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		if resp.StatusCode >= 500 {
			t.Fatalf("%s %s (%s %q): %s: %s", rt.method, rt.path, rt.how, data, resp.Status, b)
		}
		if resp.StatusCode >= 400 {
			var je struct {
				Error string `json:"error"`
			}
			if json.Unmarshal(b, &je) != nil || je.Error == "" {
				t.Errorf("%s %s (%s %q): %s without a JSON error: %q", rt.method, rt.path, rt.how, data, resp.Status, b)
			}
		}
		if rt.ownersOnly && resp.StatusCode < 300 {
			t.Errorf("%s %s opened with %s %q: %s", rt.method, rt.path, rt.how, data, resp.Status)
		}
		if rt.how == "body" && resp.StatusCode < 300 {
			t.Errorf("login with %q: %s: %s", data, resp.Status, b)
		}
	})
}
