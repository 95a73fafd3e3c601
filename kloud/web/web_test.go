package web_test

import (
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kloud/web"
)

type mux struct{ *http.ServeMux }

func (m mux) Handle(p string, h http.Handler) { m.ServeMux.Handle(p, h) }

// server mounts the UI next to handlers like kloud's, to check that patterns do not clash.
func server(t *testing.T) *httptest.Server {
	m := mux{http.NewServeMux()}
	m.HandleFunc("/kite", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("kite")) })
	m.HandleFunc("POST /api/login", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("login")) })
	web.Register(m)
	srv := httptest.NewServer(m)
	t.Cleanup(srv.Close)
	return srv
}

func get(t *testing.T, url string, hdr ...string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return res
}

func TestServes(t *testing.T) {
	srv := server(t)
	res := get(t, srv.URL+"/")
	if res.StatusCode != 200 || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("/: %d %s", res.StatusCode, res.Header.Get("Content-Type"))
	}
	if csp := res.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") {
		t.Fatalf("CSP: %q", csp)
	}
	if res.Header.Get("X-Content-Type-Options") != "nosniff" || res.Header.Get("Cache-Control") != "no-cache" {
		t.Fatalf("headers: %v", res.Header)
	}
	for p, ct := range map[string]string{
		"/static/js/app.js":                  "text/javascript",
		"/static/css/app.css":                "text/css",
		"/static/vendor/xterm/xterm.mjs":     "text/javascript",
		"/static/vendor/xterm/addon-fit.mjs": "text/javascript",
		"/static/vendor/xterm/xterm.css":     "text/css",
	} {
		res := get(t, srv.URL+p)
		if res.StatusCode != 200 || !strings.HasPrefix(res.Header.Get("Content-Type"), ct) {
			t.Fatalf("%s: %d %q", p, res.StatusCode, res.Header.Get("Content-Type"))
		}
		etag := res.Header.Get("ETag")
		if etag == "" {
			t.Fatalf("%s: no ETag", p)
		}
		if res := get(t, srv.URL+p, "If-None-Match", etag); res.StatusCode != http.StatusNotModified {
			t.Fatalf("%s with its ETag: %d, want 304", p, res.StatusCode)
		}
	}
	for _, p := range []string{"/nope", "/static/", "/static/js/missing.js", "/static/../web.go"} {
		if res := get(t, srv.URL+p); res.StatusCode != 404 {
			t.Fatalf("%s: %d, want 404", p, res.StatusCode)
		}
	}
	res, err := http.Post(srv.URL+"/", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("POST /: %d", res.StatusCode)
	}
	// The more specific patterns of kloud keep their handlers.
	if res := get(t, srv.URL+"/kite"); res.StatusCode != 200 || res.ContentLength != 4 {
		t.Fatalf("/kite: %d", res.StatusCode)
	}
}

var importRe = regexp.MustCompile(`(?m)^\s*(?:import|export)\s[^'"]*?from\s+['"]([^'"]+)['"]|^\s*import\s+['"]([^'"]+)['"]`)

// staticFiles returns the UI's files on disk (the embedded ones are the same).
func staticFiles(t *testing.T) map[string]bool {
	out := map[string]bool{}
	err := filepath.WalkDir("static", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			out["/"+filepath.ToSlash(p)] = true
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestModulesResolve checks that every import of every module, and every file index.html
// names, is a file we ship: a typo would otherwise show only in a browser.
func TestModulesResolve(t *testing.T) {
	files := staticFiles(t)
	for f := range files {
		if !strings.HasSuffix(f, ".js") {
			continue
		}
		b, err := os.ReadFile(strings.TrimPrefix(f, "/"))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range importRe.FindAllStringSubmatch(string(b), -1) {
			spec := m[1] + m[2]
			if !strings.HasPrefix(spec, ".") && !strings.HasPrefix(spec, "/") {
				t.Errorf("%s imports %q: only relative or absolute paths load in a browser", f, spec)
				continue
			}
			target := spec
			if strings.HasPrefix(spec, ".") {
				target = path.Join(path.Dir(f), spec)
			}
			if !files[target] {
				t.Errorf("%s imports %q (%s): no such file", f, spec, target)
			}
		}
	}
	idx, err := os.ReadFile("static/index.html")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`(?:src|href)="(/static/[^"]+)"`).FindAllStringSubmatch(string(idx), -1) {
		if !files[m[1]] {
			t.Errorf("index.html names %s: no such file", m[1])
		}
	}
}

// TestModulesParse runs node's syntax check on every module.
func TestModulesParse(t *testing.T) {
	node := testutil.RequireBinary(t, "node")
	dir := t.TempDir()
	for f := range staticFiles(t) {
		if !strings.HasSuffix(f, ".js") && !strings.HasSuffix(f, ".mjs") {
			continue
		}
		b, err := os.ReadFile(strings.TrimPrefix(f, "/"))
		if err != nil {
			t.Fatal(err)
		}
		tmp := filepath.Join(dir, strings.NewReplacer("/", "_").Replace(strings.TrimSuffix(strings.TrimSuffix(f, ".js"), ".mjs"))+".mjs")
		if err := os.WriteFile(tmp, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(node, "--check", tmp).CombinedOutput(); err != nil {
			t.Errorf("%s: %v\n%s", f, err, out)
		}
	}
}
