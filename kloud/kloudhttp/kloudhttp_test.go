package kloudhttp_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/kloud/kloudhttp"
)

// TestRequestSession: a bearer token wins over the session cookie; neither: "".
func TestRequestSession(t *testing.T) {
	t.Parallel()
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	if got := kloudhttp.RequestSession(r); got != "" {
		t.Errorf("no credential: %q", got)
	}
	r.AddCookie(&http.Cookie{Name: kloudhttp.SessionCookie, Value: "from-cookie"})
	if got := kloudhttp.RequestSession(r); got != "from-cookie" {
		t.Errorf("cookie: %q", got)
	}
	r.Header.Set("Authorization", "Bearer  from-header ")
	if got := kloudhttp.RequestSession(r); got != "from-header" {
		t.Errorf("bearer and cookie: %q, want the bearer's", got)
	}
}

// TestAnswers: errors are {"error": msg}, never cached; a page escapes what it shows and runs
// nothing.
func TestAnswers(t *testing.T) {
	t.Parallel()
	w := httptest.NewRecorder()
	kloudhttp.WriteError(w, http.StatusTeapot, `no "tea"`)
	if w.Code != http.StatusTeapot || strings.TrimSpace(w.Body.String()) != `{"error":"no \"tea\""}` ||
		w.Header().Get("Content-Type") != "application/json" || w.Header().Get("Cache-Control") != "no-store" {
		t.Errorf("WriteError: %d %v %s", w.Code, w.Header(), w.Body)
	}
	w = httptest.NewRecorder()
	kloudhttp.Page(w, http.StatusForbidden, "<b>refused</b>", errors.New(`<script>alert(1)</script>`))
	body := w.Body.String()
	if w.Code != http.StatusForbidden || strings.Contains(body, "<script>") || strings.Contains(body, "<b>") ||
		!strings.Contains(body, "&lt;script&gt;") || w.Header().Get("Content-Security-Policy") != "default-src 'none'" {
		t.Errorf("Page: %d %v %s", w.Code, w.Header(), body)
	}
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = "[::1]:4242"
	if got := kloudhttp.ClientIP(r); got != "::1" {
		t.Errorf("ClientIP: %q", got)
	}
}
