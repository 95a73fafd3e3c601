package relay

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/klient/klientapi"
	"github.com/kloud-dev/kloud/kloud/model"
)

// newAppsHub is a Hub with only its web apps' set-up (what the table tests below read).
func newAppsHub(t *testing.T, publicURL, appsHost string) (*Hub, error) {
	t.Helper()
	h := &Hub{o: Options{PublicURL: publicURL, AppsHost: appsHost}, appTickets: map[string]appTicket{}}
	h.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	return h, h.initApps()
}

func TestAppHosts(t *testing.T) {
	t.Parallel()
	h, err := newAppsHub(t, "https://kloud.example.com:8443", "apps.example.net")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := h.AppURL("abc1", 3000), "https://p3000--mabc1.apps.example.net:8443/"; got != want {
		t.Errorf("AppURL = %q, want %q", got, want)
	}
	for _, c := range []struct {
		host string
		id   string
		port int
		ok   bool
	}{
		{"p3000--mabc1.apps.example.net:8443", "abc1", 3000, true},
		{"P3000--MABC1.Apps.Example.Net.", "abc1", 3000, true}, // case and a trailing dot
		{"p65535--mabc.apps.example.net", "abc", 65535, true},
		{"p0--mabc.apps.example.net", "", 0, false},     // port 0
		{"p65536--mabc.apps.example.net", "", 0, false}, // past the last port
		{"p80--m.apps.example.net", "", 0, false},       // no machine
		{"x.p80--mabc.apps.example.net", "", 0, false},  // a label too many
		{"p80--mabc.apps.example.com", "", 0, false},    // another domain
		{"kloud.example.com:8443", "", 0, false},        // the UI
		{"apps.example.net", "", 0, false},
		{"p80--ma_b.apps.example.net", "", 0, false},
	} {
		id, port, ok := h.match(c.host)
		if id != c.id || port != c.port || ok != c.ok {
			t.Errorf("match(%q) = %q, %d, %v; want %q, %d, %v", c.host, id, port, ok, c.id, c.port, c.ok)
		}
	}

	// Off: no app hosts, no URLs; the default is localhost on the public URL's port.
	off, err := newAppsHub(t, "http://127.0.0.1:7000", "off")
	if err != nil {
		t.Fatal(err)
	}
	if u := off.AppURL("m1", 80); u != "" {
		t.Errorf("AppURL with apps off = %q, want none", u)
	}
	if _, _, ok := off.match("p80--m1.localhost:7000"); ok {
		t.Error("apps off matched an app host")
	}
	def, err := newAppsHub(t, "http://127.0.0.1:7000", "")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := def.AppURL("abc1", 80), "http://p80--mabc1.localhost:7000/"; got != want {
		t.Errorf("default AppURL = %q, want %q", got, want)
	}

	for _, bad := range []string{"a/b", "user@host", "a b", ".", "::1"} {
		if _, err := newAppsHub(t, "http://127.0.0.1:7000", bad); err == nil || !strings.Contains(err.Error(), "want a host name") {
			t.Errorf("apps host %q: err = %v, want a clear refusal", bad, err)
		}
	}
}

func TestNewNeedsItsDependencies(t *testing.T) {
	t.Parallel()
	if _, err := New(Options{PublicURL: "http://127.0.0.1:1"}); err == nil || !strings.Contains(err.Error(), "required") {
		t.Fatalf("New without Access, Agents, Tokens: err = %v", err)
	}
}

func TestStripCookie(t *testing.T) {
	t.Parallel()
	hd := http.Header{}
	hd.Add("Cookie", "a=1; kloud_app=secret; b=2")
	hd.Add("Cookie", "kloud_app=other")
	hd.Add("Cookie", "kloud_application=keep")
	stripCookie(hd, appCookie)
	got := strings.Join(hd.Values("Cookie"), " | ")
	if want := "a=1; b=2 | kloud_application=keep"; got != want {
		t.Errorf("Cookie headers = %q, want %q", got, want)
	}
}

func TestTruncateUTF8(t *testing.T) {
	t.Parallel()
	s := strings.Repeat("é", 100) // 200 bytes
	for n := 0; n <= 130; n++ {
		got := truncateUTF8(s, n)
		// A prefix of s, valid UTF-8, at most n bytes (it may give up one whole character more
		// than it must: a cut on a boundary drops the character before it).
		if len(got) > n || !utf8.ValidString(got) || !strings.HasPrefix(s, got) || len(got) < n-2*utf8.UTFMax {
			t.Fatalf("truncateUTF8(%d) = %d bytes, valid %v", n, len(got), utf8.ValidString(got))
		}
	}
	if got := truncateUTF8("short", 123); got != "short" {
		t.Errorf("truncateUTF8(short) = %q", got)
	}
}

func TestTerminalRequest(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		query, role string
		mode        string
		cols, rows  int
		status      int // 0: accepted
	}{
		{"", "owner", klientapi.DefaultMode(""), 80, 24, 0},
		{"cols=120&rows=40", "owner", klientapi.DefaultMode(""), 120, 40, 0},
		{"session=s1", model.GrantReadonly, klientapi.ModeReadonly, 80, 24, 0}, // a read-only share watches
		{"", model.GrantReadonly, "", 0, 0, http.StatusBadRequest},             // ... a session it names
		{"mode=create", model.GrantReadonly, "", 0, 0, http.StatusForbidden},
		{"cols=wide", "owner", "", 0, 0, http.StatusBadRequest},
		{"rows=0", "owner", "", 0, 0, http.StatusBadRequest},
		{"mode=bogus", "owner", "", 0, 0, http.StatusBadRequest},
	} {
		r := httptest.NewRequest(http.MethodGet, "/api/machines/m1/terminal?"+c.query, nil)
		p, err := terminalRequest(r, c.role)
		if c.status != 0 {
			if Status(err) != c.status {
				t.Errorf("%q as %s: err = %v (status %d), want status %d", c.query, c.role, err, Status(err), c.status)
			}
			continue
		}
		if err != nil || p.Mode != c.mode || p.Cols != c.cols || p.Rows != c.rows {
			t.Errorf("%q as %s = %+v, %v; want mode %s, %dx%d", c.query, c.role, p, err, c.mode, c.cols, c.rows)
		}
	}
}

func TestStatus(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err  error
		want int
	}{
		{nil, http.StatusOK},
		{&statusError{http.StatusUnauthorized, "not logged in"}, http.StatusUnauthorized},
		{fmt.Errorf("wrapped: %w", &statusError{http.StatusTeapot, "x"}), http.StatusTeapot},
		{fmt.Errorf("machine: %w", kite.ErrNotFound), http.StatusNotFound},
		{fmt.Errorf("share: %w", kite.ErrPermission), http.StatusForbidden},
		{fmt.Errorf("agent: %w", kite.ErrState), http.StatusConflict},
		{fmt.Errorf("store: %w", kite.ErrStoreUnavailable), http.StatusServiceUnavailable},
		{fmt.Errorf("klient: %w", kite.ErrTimeout), http.StatusGatewayTimeout},
		{errors.New("something else"), http.StatusBadGateway},
	} {
		if got := Status(c.err); got != c.want {
			t.Errorf("Status(%v) = %d, want %d", c.err, got, c.want)
		}
	}
}

func TestRoles(t *testing.T) {
	t.Parallel()
	m := &model.Machine{Label: "vm", Owner: "alice", Shares: []model.Share{
		{Username: "bob", Grant: model.GrantReadonly}, {Username: "carol", Grant: model.GrantTerminal}, {Username: "dave", Grant: model.GrantFull}}}
	for _, c := range []struct {
		user            string
		terminal, ports bool
	}{
		{"alice", true, true}, {"bob", true, false}, {"carol", true, true}, {"dave", true, true}, {"admin", false, false},
	} {
		if got := mayTerminal(c.user, m) == nil; got != c.terminal {
			t.Errorf("%s may open terminals: %v, want %v", c.user, got, c.terminal)
		}
		err := mayForward(c.user, m)
		if got := err == nil; got != c.ports {
			t.Errorf("%s may forward ports: %v, want %v", c.user, got, c.ports)
		}
		if err != nil && !errors.Is(err, kite.ErrPermission) {
			t.Errorf("%s: forwarding refused with %v, want kite.ErrPermission", c.user, err)
		}
	}
}
