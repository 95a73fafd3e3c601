package kloud_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kontrol/kontrolapi"
)

// userWorld is a test kloud with connections per user that records every response and error
// it sees, and kloud's log, so tests can scan them for secrets.
type userWorld struct {
	t     *testing.T
	e     *kloudtest.Env
	log   *testutil.SyncBuffer
	mu    sync.Mutex
	conns map[string]*kite.Conn
	seen  [][]byte
}

func newUserWorld(t *testing.T, o kloudtest.Options) *userWorld {
	t.Helper()
	buf := &testutil.SyncBuffer{}
	o.Logger = slog.New(slog.NewTextHandler(io.MultiWriter(buf, testLogWriter{t}), &slog.HandlerOptions{Level: slog.LevelDebug}))
	w := &userWorld{t: t, log: buf, conns: map[string]*kite.Conn{}}
	w.e = kloudtest.Start(t, o)
	return w
}

// as returns a connection authenticated with a kite key of user.
func (w *userWorld) as(user string) *kite.Conn {
	w.mu.Lock()
	defer w.mu.Unlock()
	if c := w.conns[user]; c != nil {
		return c
	}
	c := w.e.Dial(user)
	w.conns[user] = c
	return c
}

// call calls method as user, recording the raw result or error.
func (w *userWorld) call(user, method string, params, out any) error {
	var raw json.RawMessage
	err := w.as(user).Call(w.t.Context(), method, params, &raw)
	w.mu.Lock()
	if err != nil {
		w.seen = append(w.seen, []byte(err.Error()))
	} else {
		w.seen = append(w.seen, append([]byte(nil), raw...))
	}
	w.mu.Unlock()
	if err == nil && out != nil {
		if jerr := json.Unmarshal(raw, out); jerr != nil {
			w.t.Fatalf("%s: decode %s: %v", method, raw, jerr)
		}
	}
	return err
}

// client is user's typed client; its answers are recorded for the secret scan as call's are.
func (w *userWorld) client(user string) *api.Client { return api.NewClient(userCaller{w, user}) }

// userCaller calls through userWorld.call.
type userCaller struct {
	w    *userWorld
	user string
}

func (c userCaller) Call(_ context.Context, method string, params, result any) error {
	return c.w.call(c.user, method, params, result)
}

// ok fails the test if a call (what) failed.
func (w *userWorld) ok(err error, what string) {
	w.t.Helper()
	if err != nil {
		w.t.Fatalf("%s: %v", what, err)
	}
}

// into sets *dst to a typed call's result and returns its error:
// w.ok(into(&v)(c.Method(ctx, p)), "method").
func into[T any](dst *T) func(T, error) error {
	return func(v T, err error) error {
		*dst = v
		return err
	}
}

// errOf is a typed call's error, its result dropped.
func errOf[T any](_ T, err error) error { return err }

func (w *userWorld) must(user, method string, params, out any) {
	w.t.Helper()
	if err := w.call(user, method, params, out); err != nil {
		w.t.Fatalf("%s as %s: %v", method, user, err)
	}
}

// record adds data to what the secret scan looks at.
func (w *userWorld) record(b []byte) {
	w.mu.Lock()
	w.seen = append(w.seen, append([]byte(nil), b...))
	w.mu.Unlock()
}

// scan fails the test if any secret appears in a recorded response or kloud's log.
func (w *userWorld) scan(secrets ...string) {
	w.t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	logged := w.log.Bytes()
	for _, sec := range secrets {
		for _, b := range w.seen {
			if bytes.Contains(b, []byte(sec)) {
				w.t.Errorf("secret %q appears in a response: %s", sec, b)
			}
		}
		if bytes.Contains(logged, []byte(sec)) {
			w.t.Errorf("secret %q appears in kloud's log", sec)
		}
	}
	if len(w.seen) == 0 || len(logged) == 0 {
		w.t.Errorf("nothing recorded to scan (%d responses, %d log bytes)", len(w.seen), len(logged))
	}
}

func (w *userWorld) addUser(name, password string, admin bool) {
	w.t.Helper()
	w.ok(errOf(w.client(kloud.Admin).UserAdd(w.t.Context(), api.UserAddParams{Username: name, Password: password, Admin: admin})), "user.add")
}

type testLogWriter struct{ t testing.TB }

func (w testLogWriter) Write(p []byte) (int, error) {
	defer func() { recover() }() // a goroutine may log after the test ended
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func wantErr(t *testing.T, err, kind error, what string) {
	t.Helper()
	if !errors.Is(err, kind) {
		t.Fatalf("%s: got %v, want %v", what, err, kind)
	}
}

func TestUsersAndTeams(t *testing.T) {
	t.Parallel()
	w := newUserWorld(t, kloudtest.Options{})

	var added api.UserView
	w.ok(into(&added)(w.client(kloud.Admin).UserAdd(w.t.Context(), api.UserAddParams{Username: "alice", Password: "alice-password", Email: "alice@example.com"})), "user.add")
	if added.Username != "alice" || !added.HasPassword || added.Admin {
		t.Fatalf("user.add: %+v", added)
	}
	// Raw params on purpose: bad values, an unknown field (bogus) and names kloud reserves are
	// refused on the wire.
	for _, bad := range []map[string]any{
		{"username": "Alice"}, {"username": "a"}, {"username": "x_y"}, {"username": "admin"}, {"username": "kloud"},
		{"username": "kontrol"}, {"username": "ok-name", "password": "short"}, {"username": "ok-name", "role": "admin"},
		{"username": "ok-name", "team": "default", "role": "owner"}, {"username": "ok-name", "bogus": 1},
	} {
		wantErr(t, w.call(kloud.Admin, "user.add", bad, nil), kite.ErrInvalidParams, fmt.Sprintf("user.add %v", bad))
	}
	wantErr(t, errOf(w.client(kloud.Admin).UserAdd(w.t.Context(), api.UserAddParams{Username: "alice"})), kite.ErrConflict, "duplicate user")
	wantErr(t, errOf(w.client("alice").UserAdd(w.t.Context(), api.UserAddParams{Username: "mallory"})), kite.ErrPermission, "user.add by a non-admin")
	wantErr(t, errOf(w.client(kloud.Admin).UserAdd(w.t.Context(), api.UserAddParams{Username: "nobody", Team: "no-team"})), kite.ErrNotFound, "user.add to a missing team")

	// The hash is argon2id with its parameters, and never leaves kloud.
	u, err := w.e.Server.Store().Users().Get(t.Context(), "alice")
	if err != nil {
		t.Fatal(err)
	}
	if h := u.PasswordHash; !strings.HasPrefix(h, "$argon2id$v=19$m=") || strings.Contains(h, "alice-password") {
		t.Fatalf("stored hash %q", h)
	}

	for _, u := range []string{"bob", "carol", "dave"} {
		w.addUser(u, "", false)
	}
	var red model.Team
	w.ok(into(&red)(w.client("alice").TeamCreate(w.t.Context(), api.TeamCreateParams{Slug: "red", Title: "Red team"})), "team.create")
	if len(red.Members) != 1 || red.Members[0] != (model.Member{Username: "alice", Role: model.RoleAdmin}) {
		t.Fatalf("team.create: %+v", red)
	}
	wantErr(t, errOf(w.client("carol").TeamCreate(w.t.Context(), api.TeamCreateParams{Slug: "red"})), kite.ErrConflict, "duplicate team")
	wantErr(t, errOf(w.client("carol").TeamCreate(w.t.Context(), api.TeamCreateParams{Slug: "Blue!"})), kite.ErrInvalidParams, "bad slug")
	w.ok(errOf(w.client("carol").TeamCreate(w.t.Context(), api.TeamCreateParams{Slug: "blue"})), "team.create")

	wantErr(t, errOf(w.client("alice").TeamAddMember(w.t.Context(), api.TeamMemberParams{Team: "red", Username: "zed"})), kite.ErrNotFound, "add a user that does not exist")
	w.ok(errOf(w.client("alice").TeamAddMember(w.t.Context(), api.TeamMemberParams{Team: "red", Username: "bob"})), "team.addMember")
	wantErr(t, errOf(w.client("bob").TeamAddMember(w.t.Context(), api.TeamMemberParams{Team: "red", Username: "dave"})), kite.ErrPermission, "member adds a member")
	wantErr(t, errOf(w.client("carol").TeamAddMember(w.t.Context(), api.TeamMemberParams{Team: "red", Username: "carol"})), kite.ErrNotFound, "outsider adds themself")
	wantErr(t, errOf(w.client("carol").TeamRemoveMember(w.t.Context(), api.TeamMemberParams{Team: "red", Username: "bob"})), kite.ErrNotFound, "outsider removes a member")
	wantErr(t, errOf(w.client("alice").TeamAddMember(w.t.Context(), api.TeamMemberParams{Team: "red", Username: "dave", Role: "owner"})), kite.ErrInvalidParams, "bad role")
	w.ok(errOf(w.client(kloud.Admin).UserAdd(w.t.Context(), api.UserAddParams{Username: "erin", Team: "red", Role: "admin"})), "user.add")

	var who api.WhoamiResult
	w.ok(into(&who)(w.client("bob").UserWhoami(w.t.Context())), "user.whoami")
	if who.Username != "bob" || who.Admin || len(who.Teams) != 1 || who.Teams[0] != (api.TeamRole{Slug: "red", Title: "Red team", Role: model.RoleMember}) || who.AuthType != kite.AuthKiteKey {
		t.Fatalf("whoami bob: %+v", who)
	}
	w.ok(into(&who)(w.client(kloud.Admin).UserWhoami(w.t.Context())), "user.whoami")
	if !who.Admin || len(who.Teams) != 1 || who.Teams[0].Slug != model.DefaultTeam {
		t.Fatalf("whoami admin: %+v", who)
	}

	teamSlugs := func(user string) string {
		var res api.TeamListResult
		w.ok(into(&res)(w.client(user).TeamList(w.t.Context())), "team.list")
		var s []string
		for _, t := range res.Teams {
			s = append(s, t.Slug+":"+t.Role)
		}
		return strings.Join(s, ",")
	}
	for user, want := range map[string]string{"bob": "red:member", "carol": "blue:admin", "dave": "", kloud.Admin: "blue:,default:admin,red:"} {
		if got := teamSlugs(user); got != want {
			t.Errorf("team.list as %s: %q, want %q", user, got, want)
		}
	}

	userNames := func(user string) (string, api.UserListResult) {
		var res api.UserListResult
		w.ok(into(&res)(w.client(user).UserList(w.t.Context())), "user.list")
		var s []string
		for _, u := range res.Users {
			s = append(s, u.Username)
		}
		return strings.Join(s, ","), res
	}
	if got, res := userNames("bob"); got != "alice,bob,erin" {
		t.Errorf("user.list as bob: %s", got)
	} else if res.Users[0].Email != "" {
		t.Errorf("user.list shows emails to a non-admin: %+v", res.Users[0])
	}
	if got, res := userNames(kloud.Admin); got != "admin,alice,bob,carol,dave,erin" {
		t.Errorf("user.list as admin: %s", got)
	} else if res.Users[1].Email != "alice@example.com" || res.Users[1].Teams["red"] != model.RoleAdmin {
		t.Errorf("user.list as admin: %+v", res.Users[1])
	}

	// The last admin cannot leave; with another admin, they can; members may leave.
	w.ok(errOf(w.client("erin").TeamRemoveMember(w.t.Context(), api.TeamMemberParams{Team: "red", Username: "erin"})), "team.removeMember")
	wantErr(t, errOf(w.client("alice").TeamRemoveMember(w.t.Context(), api.TeamMemberParams{Team: "red", Username: "alice"})), kite.ErrState, "last admin leaves")
	wantErr(t, errOf(w.client("alice").TeamAddMember(w.t.Context(), api.TeamMemberParams{Team: "red", Username: "alice", Role: "member"})), kite.ErrState, "last admin demotes themself")
	w.ok(errOf(w.client("alice").TeamAddMember(w.t.Context(), api.TeamMemberParams{Team: "red", Username: "bob", Role: "admin"})), "team.addMember")
	w.ok(errOf(w.client("alice").TeamRemoveMember(w.t.Context(), api.TeamMemberParams{Team: "red", Username: "alice"})), "team.removeMember")
	if got := teamSlugs("alice"); got != "" {
		t.Errorf("alice left red but lists %q", got)
	}
	wantErr(t, errOf(w.client("bob").TeamRemoveMember(w.t.Context(), api.TeamMemberParams{Team: "red", Username: "alice"})), kite.ErrNotFound, "remove a non-member")

	// Passwords: one's own, or anyone's for an admin; the admin's creates its user document.
	w.ok(errOf(w.client("bob").UserSetPassword(w.t.Context(), api.SetPasswordParams{Password: "bob-password"})), "user.setPassword")
	wantErr(t, errOf(w.client("bob").UserSetPassword(w.t.Context(), api.SetPasswordParams{Username: "carol", Password: "carol-password"})), kite.ErrPermission, "set another's password")
	w.ok(errOf(w.client(kloud.Admin).UserSetPassword(w.t.Context(), api.SetPasswordParams{Username: kloud.Admin, Password: "admin-password"})), "user.setPassword")
	wantErr(t, errOf(w.client(kloud.Admin).UserSetPassword(w.t.Context(), api.SetPasswordParams{Username: "ghost", Password: "ghost-password"})), kite.ErrNotFound, "password of a missing user")
	if code, _ := login(t, w.e.URL, "admin", "admin-password", ""); code != http.StatusOK {
		t.Errorf("admin login after setPassword: %d", code)
	}

	w.scan("alice-password", "bob-password", "admin-password", "$argon2id$")
}

// login posts to /api/login and returns the status and decoded body.
func login(t *testing.T, base, user, password, contentType string) (int, map[string]any) {
	t.Helper()
	code, body, _ := loginResp(t, base, user, password, contentType)
	return code, body
}

func loginResp(t *testing.T, base, user, password, contentType string) (int, map[string]any, *http.Response) {
	t.Helper()
	if contentType == "" {
		contentType = "application/json"
	}
	b, _ := json.Marshal(map[string]string{"username": user, "password": password})
	resp, err := http.Post(base+"/api/login", contentType, bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	raw, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("login answer %d is not JSON: %s", resp.StatusCode, raw)
	}
	return resp.StatusCode, out, resp
}

// dialSession connects with a session, returning the error instead of failing.
func dialSession(t *testing.T, e *kloudtest.Env, session string) (*kite.Conn, error) {
	k, err := kite.New(kite.Options{Identity: kite.Identity{Name: "test-browser"}, Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	return k.Dial(t.Context(), e.URL+"/kite", kite.Auth{Type: kite.AuthSession, Key: session})
}

func TestLoginSessionsAndRateLimit(t *testing.T) {
	t.Parallel()
	w := newUserWorld(t, kloudtest.Options{})
	w.addUser("alice", "correct horse battery", false)
	w.addUser("bob", "bob's long password", false)
	w.addUser("root2", "root2-password", true)
	w.addUser("nopass", "", false)

	code, body, resp := loginResp(t, w.e.URL, "alice", "correct horse battery", "")
	if code != http.StatusOK {
		t.Fatalf("login: %d %v", code, body)
	}
	session, _ := body["session"].(string)
	if session == "" || body["username"] != "alice" {
		t.Fatalf("login answer: %v", body)
	}
	exp, err := time.Parse(time.RFC3339, body["expiresAt"].(string))
	if err != nil || exp.Sub(time.Now()) < 11*time.Hour || exp.Sub(time.Now()) > 12*time.Hour+time.Minute {
		t.Fatalf("expiresAt %v (%v), want in 12h", body["expiresAt"], err)
	}
	var cookie *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == kloud.SessionCookie {
			cookie = c
		}
	}
	if cookie == nil || cookie.Value != session || !cookie.HttpOnly || cookie.SameSite != http.SameSiteStrictMode || cookie.Path != "/" || cookie.MaxAge <= 0 {
		t.Fatalf("session cookie: %+v", cookie)
	}
	w.record([]byte(fmt.Sprint(body)))

	// The session works for kite calls (auth type "session").
	c, err := dialSession(t, w.e, session)
	if err != nil {
		t.Fatal(err)
	}
	var who api.WhoamiResult
	if err := c.Call(t.Context(), "user.whoami", nil, &who); err != nil || who.Username != "alice" || who.AuthType != kite.AuthSession || who.Admin {
		t.Fatalf("whoami with a session: %+v %v", who, err)
	}
	// GET /api/session gives the cookie's session back to the page.
	req, _ := http.NewRequest("GET", w.e.URL+"/api/session", nil)
	req.AddCookie(cookie)
	sresp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var sess kloud.LoginResponse
	json.NewDecoder(sresp.Body).Decode(&sess)
	sresp.Body.Close()
	if sresp.StatusCode != http.StatusOK || sess.Username != "alice" || sess.Session != session {
		t.Fatalf("GET /api/session: %d %+v", sresp.StatusCode, sess)
	}

	// Wrong password, unknown user and a user without a password get the same answer.
	var answers []string
	for _, u := range [][2]string{{"bob", "wrong password"}, {"nosuchuser", "whatever1"}, {"nopass", "anything1"}} {
		code, body := login(t, w.e.URL, u[0], u[1], "")
		answers = append(answers, fmt.Sprint(code, body))
	}
	if answers[0] != answers[1] || answers[1] != answers[2] || !strings.HasPrefix(answers[0], "401 ") {
		t.Fatalf("failed logins differ: %q", answers)
	}
	if code, _ := login(t, w.e.URL, "bob", "bob's long password", "text/plain"); code != http.StatusUnsupportedMediaType {
		t.Fatalf("non-JSON login: %d", code)
	}

	// Five failures per user and address, then 429 even with the right password; other users
	// from the same address are not affected.
	for i := range 4 { // one failure for bob above
		if code, _ := login(t, w.e.URL, "bob", fmt.Sprintf("guess %d", i), ""); code != http.StatusUnauthorized {
			t.Fatalf("failure %d: %d", i+2, code)
		}
	}
	code, body, resp = loginResp(t, w.e.URL, "bob", "bob's long password", "")
	if code != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" || !strings.Contains(fmt.Sprint(body["error"]), "try again in") {
		t.Fatalf("sixth login: %d %v (Retry-After %q)", code, body, resp.Header.Get("Retry-After"))
	}
	if code, _ := login(t, w.e.URL, "alice", "correct horse battery", ""); code != http.StatusOK {
		t.Fatalf("another user from the same address: %d", code)
	}

	// A kloud admin's session is an admin session, also for kontrol.
	_, body = login(t, w.e.URL, "root2", "root2-password", "")
	rc, err := dialSession(t, w.e, body["session"].(string))
	if err != nil {
		t.Fatal(err)
	}
	if err := rc.Call(t.Context(), "user.whoami", nil, &who); err != nil || !who.Admin {
		t.Fatalf("admin whoami: %+v %v", who, err)
	}
	if err := rc.Call(t.Context(), "kontrol.createKey", kontrolapi.CreateKeyParams{Username: "alice"}, nil); err != nil {
		t.Fatalf("admin session createKey: %v", err)
	}

	// Logout revokes the session: open connections close, new handshakes fail.
	lreq, _ := http.NewRequest("POST", w.e.URL+"/api/logout", nil)
	lreq.AddCookie(cookie)
	lresp, err := http.DefaultClient.Do(lreq)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]bool
	json.NewDecoder(lresp.Body).Decode(&out)
	lresp.Body.Close()
	if !out["loggedOut"] {
		t.Fatalf("logout: %v", out)
	}
	cleared := false
	for _, ck := range lresp.Cookies() {
		cleared = cleared || (ck.Name == kloud.SessionCookie && ck.MaxAge < 0)
	}
	if !cleared {
		t.Fatal("logout did not clear the cookie")
	}
	select {
	case <-c.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the logged-out session's connection stayed open")
	}
	if _, err := dialSession(t, w.e, session); !errors.Is(err, kite.ErrAuth) {
		t.Fatalf("dial with a logged-out session: %v", err)
	}

	w.scan("correct horse battery", "bob's long password", "root2-password")
}
