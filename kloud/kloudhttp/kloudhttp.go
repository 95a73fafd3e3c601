// Package kloudhttp holds the conventions of kloud's plain-HTTP answers that the kloud package
// and its subpackages share (kloud/login, the relays): JSON answers and errors, the client's
// address, the session a request carries, and the small HTML page a browser gets where no UI
// is. Read it top to bottom; it imports nothing of the module.
package kloudhttp

import (
	"encoding/json"
	"fmt"
	"html"
	"net"
	"net/http"
	"strings"
)

// SessionCookie is the name of the browser's session cookie (kloud/login sets it).
const SessionCookie = "kloud_session"

// WriteJSON answers v as JSON with status code, never cached.
func WriteJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

// WriteError answers {"error": msg} with status code.
func WriteError(w http.ResponseWriter, code int, msg string) {
	WriteJSON(w, code, map[string]string{"error": msg})
}

// ClientIP is the address (without port) a request came from.
func ClientIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// RequestSession returns the session a request carries: "Authorization: Bearer", else the
// cookie.
func RequestSession(r *http.Request) string {
	if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		return strings.TrimSpace(tok)
	}
	if c, err := r.Cookie(SessionCookie); err == nil {
		return c.Value
	}
	return ""
}

// Page answers a browser with a small HTML page: a title and what err says (escaped; no
// script, no style, never kloud's UI).
func Page(w http.ResponseWriter, code int, title string, err error) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Security-Policy", "default-src 'none'")
	w.WriteHeader(code)
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	fmt.Fprintf(w, "<!doctype html><title>%s</title><h1>%s</h1><p>%s</p>\n", html.EscapeString(title), html.EscapeString(title), html.EscapeString(msg))
}
