package kloud_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/kloud/store/storetest"
	"github.com/kloud-dev/kloud/kontrol/kontrolapi"
)

// auditEntries returns the whole audit log, oldest first (as the kloud admin).
func auditEntries(t *testing.T, c *api.Client) []api.AuditEntry {
	t.Helper()
	res, err := c.AuditList(t.Context(), api.AuditListParams{Limit: api.AuditMaxLimit})
	if err != nil {
		t.Fatal(err)
	}
	es := res.Entries
	for i, j := 0, len(es)-1; i < j; i, j = i+1, j-1 {
		es[i], es[j] = es[j], es[i]
	}
	return es
}

// findEntry returns the last entry of action by user, failing the test if there is none.
func findEntry(t *testing.T, es []api.AuditEntry, action, user string) api.AuditEntry {
	t.Helper()
	for i := len(es) - 1; i >= 0; i-- {
		if es[i].Action == action && es[i].User == user {
			return es[i]
		}
	}
	t.Fatalf("no %s entry by %q in %+v", action, user, es)
	return api.AuditEntry{}
}

// storeText is every document of every collection of st, as extended JSON.
func storeText(t *testing.T, st *store.Store) string {
	t.Helper()
	ctx := t.Context()
	names, err := st.Collection(store.CollMeta).Database().ListCollectionNames(ctx, bson.M{})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, n := range names {
		cur, err := st.Collection(n).Find(ctx, bson.M{})
		if err != nil {
			t.Fatal(err)
		}
		var docs []bson.Raw
		if err := cur.All(ctx, &docs); err != nil {
			t.Fatal(err)
		}
		for _, d := range docs {
			js, err := bson.MarshalExtJSON(d, false, false)
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&b, "%s %s\n", n, js)
		}
	}
	return b.String()
}

// TestAuditRecordsCalls: mutating calls (ok and refused) and web logins (ok and failed) each
// append one entry with who, from where, what, which target, the result and its code, chained
// by hash; read-only calls append none; audit.list filters and is for kloud admins; audit.verify
// is ok; and no secret (a credential's secret fields, a password, a password typed as a user
// name) is anywhere in the store.
func TestAuditRecordsCalls(t *testing.T) {
	t.Parallel()
	w := newCredWorld(t, kloudtest.Options{})
	ctx := t.Context()
	admin := api.NewClient(w.as(kloud.Admin))
	const davePassword = "dave-PASSWORD-5f0a1c"
	const typedAsName = "hunter2-typed-as-name"
	w.addUser("dave", davePassword, false)

	credID := w.addCred("alice", "alice's key", goodCredData())
	// bob, a member of red, may not remove alice's credential.
	wantErr(t, errOf(w.client("bob").CredentialRemove(w.t.Context(), api.CredentialRef{CredentialID: credID})), kite.ErrPermission, "bob removes alice's credential")

	// A hostile id cannot forge a line of the table: it is recorded escaped.
	forged := "nope\n99   2026-01-01 00:00:00  admin  127.0.0.1  user.add  user/mallory  ok"
	wantErr(t, errOf(w.client("alice").StackApply(w.t.Context(), api.StackApplyParams{StackID: forged})), kite.ErrNotFound, "stack.apply of a forged id")
	if code, _ := login(t, w.e.URL, "dave", davePassword, ""); code != 200 {
		t.Fatalf("login: %d", code)
	}
	if code, _ := login(t, w.e.URL, "dave", "not-"+davePassword, ""); code != 401 {
		t.Fatalf("wrong password: %d", code)
	}
	if code, _ := login(t, w.e.URL, typedAsName, davePassword, ""); code != 401 {
		t.Fatalf("unknown user: %d", code)
	}

	// A kite key made through kontrol (audited, the key itself never recorded), and a
	// revocation.
	var made kontrolapi.CreateKeyResult
	w.must(kloud.Admin, "kontrol.createKey", kontrolapi.CreateKeyParams{Username: "alice"}, &made)
	if made.Key == "" || made.KiteID == "" {
		t.Fatalf("kontrol.createKey: %+v", made)
	}
	w.must(kloud.Admin, "kontrol.revoke", kontrolapi.RevokeParams{JTI: made.KiteID, Reason: "audit test"}, nil)

	before := auditEntries(t, admin)
	// Read-only calls add nothing.
	for _, c := range []struct {
		user, method string
		params       any
	}{
		{"alice", "credential.list", api.CredentialListParams{}},
		{"alice", "credential.describe", api.CredentialRef{CredentialID: credID}},
		{"alice", "user.whoami", nil},
		{"alice", "team.list", nil},
		{"alice", "stack.list", api.StackListParams{}},
		{"alice", "template.list", api.TemplateListParams{}},
		{"alice", "job.list", api.JobListParams{}},
		{"alice", "kloud.version", nil},
		{kloud.Admin, "audit.verify", nil},
		{kloud.Admin, "user.list", nil},
		{kloud.Admin, "kontrol.getKey", nil},
	} {
		w.must(c.user, c.method, c.params, nil)
	}
	// audit.list and audit.verify are for kloud admins.
	wantErr(t, errOf(w.client("alice").AuditList(w.t.Context(), api.AuditListParams{})), kite.ErrPermission, "alice lists the audit log")
	wantErr(t, errOf(w.client("alice").AuditVerify(w.t.Context())), kite.ErrPermission, "alice verifies the audit log")
	after := auditEntries(t, admin)
	if len(after) != len(before) {
		t.Fatalf("read-only calls added entries: %+v", after[len(before):])
	}

	es := after
	for i, e := range es {
		if e.Seq != int64(i+1) || e.Hash == "" || (i > 0 && e.PrevHash != es[i-1].Hash) {
			t.Fatalf("entry %d: %+v does not chain (before: %+v)", i, e, es[max(i-1, 0)])
		}
		if e.Remote != "127.0.0.1" || e.Time.IsZero() || time.Since(e.Time) > time.Hour {
			t.Errorf("entry %d: remote %q time %v", e.Seq, e.Remote, e.Time)
		}
	}
	check := func(action, user, target, result string, code int64) {
		t.Helper()
		e := findEntry(t, es, action, user)
		if e.Target != target || e.Result != result || e.Code != code {
			t.Errorf("%s by %q: target %q result %q code %d, want %q %q %d", action, user, e.Target, e.Result, e.Code, target, result, code)
		}
	}
	check("user.add", kloud.Admin, "user/dave", "ok", 0)
	check("team.create", "alice", "team/red", "ok", 0)
	check("team.addMember", "alice", "team/red", "ok", 0)
	check("credential.add", "alice", "credential/"+credID, "ok", 0)
	check("credential.remove", "bob", "credential/"+credID, "error", kite.CodePermission)
	check("stack.apply", "alice", `stack/nope\n99   2026-01-01 00:00:00  admin  127.0.0.1  user.add  user/mallory  ok`, "error", kite.CodeNotFound)
	check("kontrol.createKey", kloud.Admin, "user/alice", "ok", 0) // the key's user (no kiteId asked for)
	check("kontrol.revoke", kloud.Admin, "token/"+made.KiteID, "ok", 0)
	check("web.login", "dave", "", "error", 401) // the last one: the wrong password
	check("web.login", "", "", "error", 401)     // an unknown name is not recorded
	var logins []string
	for _, e := range es {
		if e.Action == "web.login" {
			logins = append(logins, e.User+":"+e.Result)
		}
	}
	if strings.Join(logins, " ") != "dave:ok dave:error :error" {
		t.Errorf("logins: %v", logins)
	}

	// Filters.
	list := func(p api.AuditListParams) []api.AuditEntry {
		t.Helper()
		res, err := admin.AuditList(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		return res.Entries
	}
	if got := list(api.AuditListParams{User: "bob"}); len(got) != 1 || got[0].Action != "credential.remove" {
		t.Errorf("user bob: %+v", got)
	}
	if got := list(api.AuditListParams{Target: credID}); len(got) != 2 || got[0].Action != "credential.remove" || got[1].Action != "credential.add" {
		t.Errorf("target %s (newest first): %+v", credID, got)
	}
	if got := list(api.AuditListParams{Action: "team.create"}); len(got) != 2 {
		t.Errorf("action team.create: %+v", got)
	}
	if got := list(api.AuditListParams{Since: time.Now().Add(time.Hour)}); len(got) != 0 {
		t.Errorf("since an hour from now: %+v", got)
	}
	if got := list(api.AuditListParams{Limit: 2}); len(got) != 2 || got[0].Seq != es[len(es)-1].Seq {
		t.Errorf("limit 2: %+v", got)
	}
	if _, err := admin.AuditList(ctx, api.AuditListParams{Limit: api.AuditMaxLimit + 1}); !errors.Is(err, kite.ErrInvalidParams) {
		t.Errorf("limit too large: %v", err)
	}

	v, err := admin.AuditVerify(ctx)
	if err != nil || !v.OK || v.Head != es[len(es)-1].Seq || v.HeadHash != es[len(es)-1].Hash {
		t.Fatalf("verify: %+v %v", v, err)
	}

	text := storeText(t, w.e.Server.Store())
	if !strings.Contains(text, "credential.add") {
		t.Fatal("the store dump has no audit entries: the scan below would prove nothing")
	}
	for _, secret := range []string{testSecretKey, testToken, davePassword, typedAsName, made.Key} {
		if strings.Contains(text, secret) {
			for _, line := range strings.Split(text, "\n") {
				if strings.Contains(line, secret) {
					t.Errorf("secret %q is in the store: %.300s", secret, line)
				}
			}
		}
	}
}

// TestAuditVerify: audit.verify names an entry edited in the store (and is ok again once the
// edit is undone) and an entry deleted from it.
func TestAuditVerify(t *testing.T) {
	t.Parallel()
	w := newUserWorld(t, kloudtest.Options{})
	admin := api.NewClient(w.as(kloud.Admin))
	ctx := t.Context()
	for i := range 6 {
		w.ok(errOf(w.client(kloud.Admin).TeamCreate(w.t.Context(), api.TeamCreateParams{Slug: fmt.Sprintf("team-%d", i)})), "team.create")
	}
	coll := w.e.Server.Store().Collection(store.CollAudit)
	verify := func() api.AuditVerifyResult {
		t.Helper()
		v, err := admin.AuditVerify(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if v := verify(); !v.OK || v.Checked != 6 {
		t.Fatalf("untouched: %+v", v)
	}
	if _, err := coll.UpdateOne(ctx, bson.M{"_id": int64(3)}, bson.M{"$set": bson.M{"target": "team/other"}}); err != nil {
		t.Fatal(err)
	}
	if v := verify(); v.OK || v.BadSeq != 3 || !strings.Contains(v.Problem, "edited") {
		t.Fatalf("edited entry 3: %+v", v)
	}
	if _, err := coll.UpdateOne(ctx, bson.M{"_id": int64(3)}, bson.M{"$set": bson.M{"target": "team/team-2"}}); err != nil {
		t.Fatal(err)
	}
	if v := verify(); !v.OK {
		t.Fatalf("edit undone: %+v", v)
	}
	if _, err := coll.DeleteOne(ctx, bson.M{"_id": int64(2)}); err != nil {
		t.Fatal(err)
	}
	if v := verify(); v.OK || v.BadSeq != 2 || !strings.Contains(v.Problem, "missing") {
		t.Fatalf("deleted entry 2: %+v", v)
	}
}

// TestAuditRetention: with a short audit retention, kloud's retention task prunes old
// entries, keeps the newest, records the pruning in the log, and the kept chain verifies; new
// calls go on chaining after it.
func TestAuditRetention(t *testing.T) {
	t.Parallel()
	// A retention of 2 s: long enough for the listing right after team "new" on a loaded host.
	w := newUserWorld(t, kloudtest.Options{Retention: kloud.Retention{Audit: 2 * time.Second, Interval: 100 * time.Millisecond}})
	admin := api.NewClient(w.as(kloud.Admin))
	ctx := t.Context()
	for i := range 5 {
		w.ok(errOf(w.client(kloud.Admin).TeamCreate(w.t.Context(), api.TeamCreateParams{Slug: fmt.Sprintf("old-%d", i)})), "team.create")
	}
	var v api.AuditVerifyResult
	testutil.Eventually(t, 30*time.Second, func() bool {
		var err error
		v, err = admin.AuditVerify(ctx)
		return err == nil && v.From >= 5
	}, "the first five entries were not pruned")
	if !v.OK {
		t.Fatalf("verify after pruning: %+v", v)
	}
	w.ok(errOf(w.client(kloud.Admin).TeamCreate(w.t.Context(), api.TeamCreateParams{Slug: "new"})), "team.create")
	es := auditEntries(t, admin)
	if len(es) == 0 || es[0].Seq <= 5 {
		t.Fatalf("entries after pruning: %+v", es)
	}
	last := findEntry(t, es, "team.create", kloud.Admin)
	if last.Target != "team/new" {
		t.Fatalf("newest team.create: %+v", last)
	}
	// The pruner records each pass that pruned entries (audit.prune by kloud), and prunes its
	// own records too: between deleting the last one and appending the next, a listing sees
	// none (1.8 s on a loaded CI host). Look until one shows.
	hasPrune := func() bool {
		for _, e := range es {
			if e.Action == "audit.prune" && e.User == "kloud" {
				return true
			}
		}
		return false
	}
	testutil.Eventually(t, 30*time.Second, func() bool { es = auditEntries(t, admin); return hasPrune() },
		"no audit.prune entry by kloud in %+v", es)
	if v, err := admin.AuditVerify(ctx); err != nil || !v.OK || v.From < 5 {
		t.Fatalf("verify: %+v %v", v, err)
	}
}

// TestAuditConcurrentCalls: 20 users calling at once leave one unbroken chain with one entry
// per call.
//
// Not parallel: its 20 calls at once share the embedded store's one connection, whose checkout
// gives up after 1.5 s; on a loaded machine (load average above 20) entries were dropped, beside
// other tests or alone.
func TestAuditConcurrentCalls(t *testing.T) {
	w := newUserWorld(t, kloudtest.Options{})
	admin := api.NewClient(w.as(kloud.Admin))
	const n = 20
	conns := make([]*kite.Conn, n)
	for i := range conns {
		conns[i] = w.e.Dial(fmt.Sprintf("user-%d", i))
	}
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Go(func() {
			if _, err := api.NewClient(c).TeamCreate(context.Background(), api.TeamCreateParams{Slug: fmt.Sprintf("t-%d", i)}); err != nil {
				t.Errorf("team.create %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	es := auditEntries(t, admin)
	if len(es) != n {
		t.Fatalf("%d entries, want %d", len(es), n)
	}
	users := map[string]bool{}
	for i, e := range es {
		users[e.User] = true
		if e.Seq != int64(i+1) || (i > 0 && e.PrevHash != es[i-1].Hash) {
			t.Fatalf("entry %d: %+v", i, e)
		}
	}
	if len(users) != n {
		t.Fatalf("users: %v", users)
	}
	if v, err := admin.AuditVerify(t.Context()); err != nil || !v.OK || v.Checked != n {
		t.Fatalf("verify: %+v %v", v, err)
	}
}

// TestAuditConnections: a web terminal and a port-forward tunnel each leave an open entry and,
// when they end, a close entry with their duration and the bytes relayed; killing a terminal
// session is recorded; a terminal refused to a user is recorded as an error with its status;
// opening a web app is recorded.
func TestAuditConnections(t *testing.T) {
	t.Parallel()
	e := newTermEnv(t)
	admin := api.NewClient(e.Dial(kloud.Admin))
	cookie := e.login("alice", "alice-password")
	target := "machine/" + e.machine.ID

	term := e.mustOpen(cookie, "session=audit")
	term.Type(t, "echo audited-$((6*7))\r")
	term.WaitFor(t, "audited-42")
	term.WS.Close(websocket.StatusNormalClosure, "")
	var es []api.AuditEntry
	closed := func(action string) bool {
		es = auditEntries(t, admin)
		for _, e := range es {
			if e.Action == action {
				return true
			}
		}
		return false
	}
	testutil.Eventually(t, 20*time.Second, func() bool { return closed("terminal.close") }, "no terminal.close entry")
	open, end := findEntry(t, es, "terminal.open", "alice"), findEntry(t, es, "terminal.close", "alice")
	if open.Target != target || open.Result != "ok" || end.Target != target || end.Bytes < int64(len("audited-42")) || end.Seq <= open.Seq {
		t.Fatalf("terminal entries: %+v %+v", open, end)
	}

	// Killing the session (it outlives its tab) is recorded too.
	req, _ := http.NewRequest("DELETE", e.URL+"/api/machines/"+e.machine.ID+"/sessions/audit", nil)
	req.Header.Set("Cookie", kloud.SessionCookie+"="+cookie)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 {
		t.Fatalf("kill: %v %s", err, status(resp))
	}
	if k := findEntry(t, auditEntries(t, admin), "terminal.kill", "alice"); k.Target != target || k.Result != "ok" {
		t.Fatalf("terminal.kill: %+v", k)
	}

	addUsers(t, e.Env, true, "carol")
	if _, resp, err := e.open(e.login("carol", "carol-password"), ""); err == nil || resp.StatusCode != http.StatusNotFound {
		t.Fatalf("carol opens alice's terminal: %v %s", err, status(resp))
	}
	es = auditEntries(t, admin)
	if c := findEntry(t, es, "terminal.open", "carol"); c.Result != "error" || c.Code != http.StatusNotFound || c.Target != target {
		t.Fatalf("carol's refused terminal: %+v", c)
	}

	app := startAppServer(t)
	tun := dialTunnel(t, e.URL, e.machine.ID, app.port, cookie)
	fmt.Fprintf(tun, "GET /hello HTTP/1.0\r\nHost: x\r\n\r\n")
	reply, err := io.ReadAll(tun)
	if err != nil || !strings.Contains(string(reply), "hello from the machine") {
		t.Fatalf("through the tunnel: %q %v", reply, err)
	}
	tun.Close()
	testutil.Eventually(t, 20*time.Second, func() bool { return closed("portforward.close") }, "no portforward.close entry")
	portTarget := fmt.Sprintf("%s:%d", target, app.port)
	open, end = findEntry(t, es, "portforward.open", "alice"), findEntry(t, es, "portforward.close", "alice")
	if open.Target != portTarget || open.Result != "ok" || end.Target != portTarget || end.Bytes < int64(len(reply)) {
		t.Fatalf("port-forward entries: %+v %+v", open, end)
	}

	b := newBrowser(t, e.URL)
	req, _ = http.NewRequest("GET", fmt.Sprintf("%s/api/machines/%s/ports/%d/open", e.URL, e.machine.ID, app.port), nil)
	req.Header.Set("Cookie", kloud.SessionCookie+"="+cookie)
	b.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := b.Do(req)
	if err != nil || resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("open the app: %v %s", err, status(resp))
	}
	resp.Body.Close()
	if a := findEntry(t, auditEntries(t, admin), "app.open", "alice"); a.Target != portTarget || a.Result != "ok" {
		t.Fatalf("app.open: %+v", a)
	}
	if v, err := admin.AuditVerify(t.Context()); err != nil || !v.OK {
		t.Fatalf("verify: %+v %v", v, err)
	}
}

// TestAuditFailureKeepsTheCall: when the audit entry cannot be written, the call's own answer
// is unchanged and kloud logs the entry it could not record: a call that succeeded still
// succeeds (the audit head record made unreadable in the store), a call that failed because
// the store is down still fails with the store-unavailable code, not with an audit error.
func TestAuditFailureKeepsTheCall(t *testing.T) {
	t.Parallel()
	db := storetest.NewServer(t)
	lb := &logBuf{t: t}
	e := kloudtest.Start(t, kloudtest.Options{MongoURL: db.URL, Logger: slog.New(slog.NewTextHandler(lb, nil))})
	admin := e.Client(kloud.Admin)
	ctx := t.Context()
	if _, err := admin.TeamCreate(ctx, api.TeamCreateParams{Slug: "before"}); err != nil {
		t.Fatal(err)
	}
	meta := e.Server.Store().Collection(store.CollMeta)
	if _, err := meta.UpdateOne(ctx, bson.M{"_id": "auditHead"}, bson.M{"$set": bson.M{"seq": "not a number"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.TeamCreate(ctx, api.TeamCreateParams{Slug: "unaudited"}); err != nil {
		t.Fatalf("team.create with the audit log broken: %v", err)
	}
	if n := lb.count(`msg="audit: entry not recorded" action=team.create user=admin`); n != 1 {
		t.Fatalf("%d log lines for the entry not recorded, want 1", n)
	}
	if _, err := meta.UpdateOne(ctx, bson.M{"_id": "auditHead"}, bson.M{"$set": bson.M{"seq": int64(1)}}); err != nil {
		t.Fatal(err)
	}

	db.Stop()
	_, err := admin.TeamCreate(ctx, api.TeamCreateParams{Slug: "during"})
	if !errors.Is(err, kite.ErrStoreUnavailable) {
		t.Fatalf("team.create with the store down: %v, want %d", err, kite.CodeStoreUnavailable)
	}
	testutil.Eventually(t, 20*time.Second, func() bool { return lb.count(`msg="audit: entry not recorded" action=team.create`) == 2 },
		"no log line for the entry of the call made while the store was down")
	db.Start()
	testutil.Eventually(t, 30*time.Second, func() bool {
		_, err := admin.TeamCreate(ctx, api.TeamCreateParams{Slug: "after"})
		return err == nil
	}, "team.create after the store came back")
	es := auditEntries(t, admin)
	var got []string
	for _, e := range es {
		// A try of "after" made while the store's connection was coming back may have failed,
		// and been recorded as failed (ci53): the calls that succeeded are what must be there.
		if e.Result == "ok" {
			got = append(got, e.Target)
		}
	}
	if strings.Join(got, " ") != "team/before team/after" {
		t.Fatalf("entries that succeeded: %v, want team/before team/after", got)
	}
	if v, err := admin.AuditVerify(ctx); err != nil || !v.OK {
		t.Fatalf("verify: %+v %v", v, err)
	}
}
