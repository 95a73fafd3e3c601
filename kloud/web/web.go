// Package web is kloud's browser UI: plain ES modules and CSS under static/, embedded with
// go:embed and served as they are (no build step). Start with Register, which mounts Handler on
// a kloud server; on the browser side, static/js/app.js is the router,
// static/js/kite.js the kite protocol client every page uses (docs/protocol.md) and
// static/js/boot.js, the one classic script, loads the page again when the app's modules did not
// download (the browser runs none of them then, and the page would stay at "Loading…").
//
// The UI talks to kloud only through the kite endpoint (/kite, handshake with the session from
// POST /api/login) and the terminal WebSockets under /api/machines/. xterm.js is vendored into
// static/vendor/xterm by `make vendor-xterm` from the npm packages pinned in e2e/browser.
package web

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"net/http"
	"path"
	"strings"
	"time"
)

//go:embed static
var files embed.FS

// Mux is what Register needs of a server: *kloud.Server is one.
type Mux interface {
	Handle(pattern string, h http.Handler)
}

// Register mounts the UI at / on s (more specific patterns, such as /kite and /api/, keep
// their handlers).
func Register(s Mux) { s.Handle("/", Handler()) }

// contentTypes are the types of the files we ship (mime's table varies by system).
var contentTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".mjs":  "text/javascript; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".svg":  "image/svg+xml",
	".png":  "image/png",
	".txt":  "text/plain; charset=utf-8",
}

// csp allows only this origin: scripts and styles from /static, connections (the kite and
// terminal WebSockets) to this host. xterm.js sets inline styles, hence 'unsafe-inline' for
// styles only.
const csp = "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; " +
	"connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

type asset struct {
	body  []byte
	ctype string
	etag  string
}

type handler struct {
	assets map[string]*asset // by URL path
}

// Handler serves the UI: index.html at /, the files under /static/, 404 for anything else.
// Files are revalidated on every load (Cache-Control: no-cache) against a content ETag, so a
// new kloud never runs with a stale page.
func Handler() http.Handler {
	h := &handler{assets: map[string]*asset{}}
	err := fs.WalkDir(files, "static", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := files.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		ct := contentTypes[path.Ext(p)]
		if ct == "" {
			ct = http.DetectContentType(b)
		}
		h.assets["/"+p] = &asset{body: b, ctype: ct, etag: `"` + hex.EncodeToString(sum[:12]) + `"`}
		return nil
	})
	if err != nil {
		panic("web: embedded files: " + err.Error()) // cannot happen: they are compiled in
	}
	h.assets["/"] = h.assets["/static/index.html"]
	return h
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("X-Frame-Options", "DENY")
	a := h.assets[r.URL.Path]
	if a == nil || (r.URL.Path != "/" && !strings.HasPrefix(r.URL.Path, "/static/")) {
		http.Error(w, "404 page not found", http.StatusNotFound)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		hd.Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	if strings.HasPrefix(a.ctype, "text/html") {
		hd.Set("Content-Security-Policy", csp)
	}
	hd.Set("Content-Type", a.ctype)
	hd.Set("Cache-Control", "no-cache")
	hd.Set("ETag", a.etag)
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(a.body))
}
