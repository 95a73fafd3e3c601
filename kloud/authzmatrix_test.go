package kloud_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/providers/dummy"
)

// TestAuthzMatrix is the authorization test generated from the route table: every kloud method
// (Server.Routes, with its declared Who) and every authenticated HTTP route (Server.HTTPRoutes) is
// called by every kind of identity against one real kloud, and the outcome is checked against the
// declared policy:
//
//   - Who level, every method × identity, params {}: the credentials that are no user (no auth,
//     an expired session, a token for another kite, a revoked kite key, a machine's agent key, a
//     provider plugin's key) are refused (-32001/-32002, or at the handshake) by every method but
//     the plugin's own; users are refused by the route exactly when its Who excludes their role
//     (owners, template admins, auditors, members). Authorization comes before validation: a
//     refused caller never learns whether its params were valid.
//   - Object level, every method whose params name a machine, stack or job of alice's: a user
//     outside her team, and a team member (these are private to alice), are refused (-32004 "not
//     found", or -32002); share grants are checked on the machine's methods against sharePolicy
//     (readonly and terminal may read, full may also power, ports and snapshots; only the owner
//     and team admins share, set and upgrade). Calls that would change alice's things as an
//     allowed caller are not made (they would change the world the other cells see).
//   - HTTP: every route that authenticates a session or kite key, with each non-user credential
//     and with the outsider's key, answers 401, 403 or 404, never 2xx or 5xx.
//
// A method without a declared Who, or a machine method without a share policy, fails the test.
// The totals are printed (docs/RELIABILITY.md, "Hostile input").
func TestAuthzMatrix(t *testing.T) {
	t.Parallel()
	f := newFlow(t, dummy.Options{})
	ctx := t.Context()
	admin := f.Client(kloud.Admin)
	must := func(err error, what string) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	must(errOf(admin.TeamCreate(ctx, api.TeamCreateParams{Slug: "blue", Title: "Blue"})), "team.create blue")
	for _, u := range []struct{ name, team string }{
		{"carol", model.DefaultTeam}, {"dave", model.DefaultTeam}, {"bob", "blue"}, {"ro", "blue"}, {"term", "blue"},
		{"full", "blue"}, {"audi", "blue"}, {"tadm", "blue"},
	} {
		must(errOf(admin.UserAdd(ctx, api.UserAddParams{Username: u.name, Team: u.team})), "user.add "+u.name)
	}
	must(errOf(admin.TeamAddMember(ctx, api.TeamMemberParams{Team: model.DefaultTeam, Username: "dave", Role: model.RoleAdmin})), "team admin dave")
	must(errOf(admin.UserSetRole(ctx, api.SetRoleParams{Username: "audi", Role: model.RoleAuditor})), "auditor")
	must(errOf(admin.UserSetRole(ctx, api.SetRoleParams{Username: "tadm", Role: model.RoleTemplateAdmin})), "template admin")
	f.credential()
	sid, ms := f.stack(f.template(twoVMs))
	mid := ms[0].ID
	for user, grant := range map[string]string{"ro": model.GrantReadonly, "term": model.GrantTerminal, "full": model.GrantFull} {
		must(errOf(f.client().MachineShare(ctx, api.ShareParams{MachineID: mid, Username: user, Grant: grant})), "share "+grant)
	}
	f.follow(f.apply(sid, true)) // a job of alice's (destroying the never-built stack leaves its records)
	jobs, err := f.client().JobList(ctx, api.JobListParams{})
	must(err, "job.list")
	if len(jobs.Jobs) == 0 {
		t.Fatal("alice has no job")
	}
	sid2, ms2 := f.stack(f.template(twoVMs)) // the stack and machine the cells address
	mid = ms2[0].ID
	for user, grant := range map[string]string{"ro": model.GrantReadonly, "term": model.GrantTerminal, "full": model.GrantFull} {
		must(errOf(f.client().MachineShare(ctx, api.ShareParams{MachineID: mid, Username: user, Grant: grant})), "share "+grant)
	}
	objects := map[string]string{"machineId": mid, "stackId": sid2, "jobId": jobs.Jobs[0].ID}

	// The identities. A user's role decides the Who level; refused ones never reach a handler.
	sg := *f.Server.Kontrol.Signer()
	sg.Now = func() time.Time { return time.Now().Add(-3 * time.Hour) }
	expired, err := sg.Session("alice", false, time.Hour)
	must(err, "expired session")
	wrongAud, err := f.Server.Kontrol.Signer().Token("alice", "another-kite", time.Minute)
	must(err, "token")
	revoked, revokedID, err := f.Server.Kontrol.CreateKey("alice", "")
	must(err, "key")
	must(f.Server.Kontrol.Revoke(ctx, revokedID, "authz matrix"), "revoke")
	agent, _, err := f.Server.Kontrol.CreateAgentKey(kitekey.AgentKeySpec{Owner: "alice", MachineID: mid, StackID: sid2})
	must(err, "agent key")
	plugin, _, err := f.Server.Kontrol.CreatePluginKey(kitekey.PluginKeySpec{Provider: "example"})
	must(err, "plugin key")
	replica, err := f.Server.Signer().ReplicaKey("another-replica", time.Hour)
	must(err, "replica key")
	type identity struct {
		name string
		auth kite.Auth
		role string // kloud-wide role of a user; "" for credentials that are no user
		kind string // "owner" (alice), "kloudOwner", "teamAdmin", "teamMember", "outsider", a grant, or "nouser"
	}
	keyOf := func(u string) kite.Auth {
		k, _, err := f.Server.Kontrol.CreateKey(u, "")
		must(err, "key of "+u)
		return kite.Auth{Type: kite.AuthKiteKey, Key: k}
	}
	ids := []identity{
		{"owner (alice)", keyOf("alice"), model.RoleUser, "owner"},
		{"kloud owner (admin)", keyOf(kloud.Admin), model.RoleOwner, "kloudOwner"},
		{"team admin (dave)", keyOf("dave"), model.RoleUser, "teamAdmin"},
		{"team member (carol)", keyOf("carol"), model.RoleUser, "teamMember"},
		{"share readonly (ro)", keyOf("ro"), model.RoleUser, model.GrantReadonly},
		{"share terminal (term)", keyOf("term"), model.RoleUser, model.GrantTerminal},
		{"share full (full)", keyOf("full"), model.RoleUser, model.GrantFull},
		{"other user (bob)", keyOf("bob"), model.RoleUser, "outsider"},
		{"auditor (audi)", keyOf("audi"), model.RoleAuditor, "auditor"},
		{"template admin (tadm)", keyOf("tadm"), model.RoleTemplateAdmin, "outsider"},
		{"agent key", kite.Auth{Type: kite.AuthKiteKey, Key: agent}, "", "nouser"},
		{"plugin key", kite.Auth{Type: kitekey.KindPluginKey, Key: plugin}, "", "plugin"},
		{"replica key", kite.Auth{Type: kitekey.KindReplicaKey, Key: replica}, "", "replica"},
		{"no auth", kite.Auth{}, "", "nouser"},
		{"expired session", kite.Auth{Type: kite.AuthSession, Key: expired}, "", "nouser"},
		{"token for another kite", kite.Auth{Type: kite.AuthToken, Key: wrongAud}, "", "nouser"},
		{"revoked kite key", kite.Auth{Type: kite.AuthKiteKey, Key: revoked}, "", "nouser"},
	}

	routes := f.Server.Routes()
	var mu sync.Mutex
	counts := map[string]int{}
	count := func(k string) { mu.Lock(); counts[k]++; mu.Unlock() }
	for _, r := range routes {
		if _, ok := whoAllows[r.Who]; !ok {
			t.Errorf("%s: Who %q is not a declared policy the matrix knows", r.Method, r.Who)
		}
		if objectField(r.Params) == "machineId" && !notAddressing[r.Method] {
			if _, ok := sharePolicy[r.Method]; !ok {
				t.Errorf("%s: a machine method without a share policy in sharePolicy (authzmatrix_test.go)", r.Method)
			}
		}
	}
	for _, id := range ids {
		t.Run(id.name, func(t *testing.T) {
			t.Parallel()
			k, err := kite.New(kite.Options{Identity: kite.Identity{Name: "authz"}, CallTimeout: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			defer k.Close()
			c, dialErr := k.Dial(ctx, f.URL+"/kite", id.auth)
			call := func(method string, params any) error {
				if dialErr != nil {
					return dialErr
				}
				return c.Call(ctx, method, params, nil)
			}
			for _, r := range routes {
				allowed := whoAllows[r.Who](id.role, id.kind)
				err := call(r.Method, map[string]any{})
				switch {
				case allowed && routeRefused(err):
					t.Errorf("%s (%s): refused, but the route allows %s: %v", r.Method, r.Who, id.name, err)
				case !allowed && !refused(err):
					t.Errorf("%s (%s): %v, want refused for %s", r.Method, r.Who, err, id.name)
				}
				count("who")
				if allowed {
					count("who allowed")
				} else {
					count("who refused")
				}
				field := objectField(r.Params)
				if !allowed || field == "" || notAddressing[r.Method] {
					continue
				}
				want, ok := objectPolicy(r, field, id.kind)
				if !ok { // allowed to change alice's things: not called
					count("object allowed, not called")
					continue
				}
				params := fillParams(r.Params, objects)
				err = call(r.Method, params)
				switch {
				case want && (routeRefused(err) || errors.Is(err, kite.ErrNotFound) || errors.Is(err, kite.ErrPermission)):
					t.Errorf("%s of alice's %s as %s: %v, want allowed", r.Method, field, id.name, err)
				case !want && !(errors.Is(err, kite.ErrNotFound) || errors.Is(err, kite.ErrPermission)):
					t.Errorf("%s of alice's %s as %s: %v, want -32004 not found or -32002", r.Method, field, id.name, err)
				}
				count("object")
				if want {
					count("object allowed")
				} else {
					count("object refused")
				}
			}
			if id.kind == "nouser" || id.kind == "plugin" || id.kind == "replica" || id.kind == "outsider" && id.role == model.RoleUser {
				checkHTTPRoutes(t, f.Server.HTTPRoutes(), f.URL, id.auth.Key, mid, count)
			}
		})
	}
	t.Cleanup(func() {
		keys := make([]string, 0, len(counts))
		for k := range counts {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var b strings.Builder
		for _, k := range keys {
			fmt.Fprintf(&b, " %s=%d", k, counts[k])
		}
		t.Logf("authorization matrix: %d methods × %d identities;%s", len(routes), len(ids), b.String())
	})
}

// whoAllows says, for each declared Who, whether a caller of kloud-wide role (""
// for credentials that are no user) and kind passes the route's check.
var whoAllows = map[kloud.Who]func(role, kind string) bool{
	kloud.Members:        func(role, _ string) bool { return role != "" && role != model.RoleAuditor },
	kloud.MembersRead:    func(role, _ string) bool { return role != "" },
	kloud.Owners:         func(role, _ string) bool { return role == model.RoleOwner },
	kloud.TemplateAdmins: func(role, _ string) bool { return role == model.RoleOwner || role == model.RoleTemplateAdmin },
	kloud.OwnersAuditors: func(role, _ string) bool { return role == model.RoleOwner || role == model.RoleAuditor },
	kloud.PluginsOnly:    func(_, kind string) bool { return kind == "plugin" },
	kloud.ReplicasOnly:   func(_, kind string) bool { return kind == "replica" },
}

// sharePolicy: the share grants that may call each machine method on a machine shared with
// them (what shares.go and the routes' comments document); the owner and team admins may
// call every one, other users none.
var sharePolicy = map[string][]string{
	api.MethodMachineInfo:         {model.GrantReadonly, model.GrantTerminal, model.GrantFull},
	api.MethodMachinePortsList:    {model.GrantReadonly, model.GrantTerminal, model.GrantFull},
	api.MethodMachineStart:        {model.GrantFull},
	api.MethodMachineStop:         {model.GrantFull},
	api.MethodMachinePortsOpen:    {model.GrantFull},
	api.MethodMachinePortsClose:   {model.GrantFull},
	api.MethodMachineSnapshot:     {model.GrantFull},
	api.MethodMachineRestore:      {model.GrantFull},
	api.MethodMachineSnapshots:    {model.GrantFull},
	api.MethodMachineShare:        {},
	api.MethodMachineUnshare:      {},
	api.MethodMachineShares:       {model.GrantReadonly, model.GrantTerminal, model.GrantFull}, // who else has it
	api.MethodMachineSet:          {},
	api.MethodMachineUpgradeAgent: {},
}

// objectPolicy: whether kind may act on alice's object (named by field) through r, and ok false
// when it may and r changes something (the call is not made).
func objectPolicy(r kloud.Route, field, kind string) (want, ok bool) {
	switch kind {
	case "owner", "kloudOwner":
		want = true
	case "teamAdmin": // a job is its owner's and kloud owners' (jobs.go)
		want = field != "jobId"
	case "auditor": // sees everything in read-only calls, changes nothing
		want = r.Who.ReadOnly()
	case model.GrantReadonly, model.GrantTerminal, model.GrantFull:
		want = field == "machineId" && contains(sharePolicy[r.Method], kind)
	}
	if want && (!r.Who.ReadOnly() || hasField(r.Params, "label")) { // a bucket's: none exists here
		return true, false
	}
	return want, true
}

func hasField(p reflect.Type, name string) bool {
	for i := range p.NumField() {
		if strings.Split(p.Field(i).Tag.Get("json"), ",")[0] == name {
			return true
		}
	}
	return false
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// notAddressing are methods whose machineId, stackId or jobId filters what they list or stream
// (the caller sees only its own there), rather than naming one object to act on.
var notAddressing = map[string]bool{
	api.MethodMachineList: true, api.MethodStackList: true, api.MethodJobList: true, api.MethodEventWatch: true,
	api.MethodMachineSnapshots: true, // one's own snapshots of the machine
}

// fillParams makes params of type p naming alice's objects, with valid values in the other
// fields the methods validate (so a refusal is for who calls, not for what was sent).
func fillParams(p reflect.Type, objects map[string]string) map[string]any {
	values := map[string]any{
		"username": "bob", "grant": model.GrantReadonly, "port": 8080, "snapshotId": "x", "label": "b1",
		"resource": "vm", "count": 1, "protocol": "tcp", "access": "read", "idleTimeout": "1h",
		"rules": []any{map[string]any{"port": 8000, "protocol": "tcp", "from": "team"}},
	}
	out := map[string]any{}
	for i := range p.NumField() {
		name := strings.Split(p.Field(i).Tag.Get("json"), ",")[0]
		if v, ok := objects[name]; ok {
			out[name] = v
		} else if v, ok := values[name]; ok {
			out[name] = v
		}
	}
	return out
}

// objectField is the json name of the params' field naming one of alice's objects, or "".
func objectField(p reflect.Type) string {
	if p == nil || p.Kind() != reflect.Struct {
		return ""
	}
	for i := range p.NumField() {
		name := strings.Split(p.Field(i).Tag.Get("json"), ",")[0]
		switch name {
		case "machineId", "stackId", "jobId":
			return name
		}
	}
	return ""
}

// refused: the call was refused for who is calling (-32001, -32002), or the handshake was.
func refused(err error) bool {
	var ke *kite.Error
	return errors.Is(err, kite.ErrAuth) || errors.Is(err, kite.ErrPermission) || err != nil && !errors.As(err, &ke)
}

// routeRefused: refused before the handler: by the credential, the agent or plugin gate, or the
// route's Who (authorize's messages, routes.go).
func routeRefused(err error) bool {
	if errors.Is(err, kite.ErrAuth) {
		return true
	}
	if !errors.Is(err, kite.ErrPermission) {
		return false
	}
	for _, s := range []string{"is for kloud owners", "auditors change nothing", "plugin keys may only", "replica keys may only", "is for kloud replicas", "no authorization in the route table", "agent"} {
		if strings.Contains(err.Error(), s) {
			return true
		}
	}
	return false
}

// checkHTTPRoutes calls every HTTP route that authenticates a session or kite key with a
// credential that must not open it (no user's, or an outsider's for alice's machine): 401,
// 403 or 404, never 2xx or 5xx.
func checkHTTPRoutes(t *testing.T, routes []kloud.HTTPRoute, base, cred, mid string, count func(string)) {
	t.Helper()
	for _, r := range routes {
		if !strings.Contains(r.Who, "session") || !strings.Contains(r.Pattern, "/api/") || strings.HasPrefix(r.Pattern, "POST /api/logout") || strings.Contains(r.Pattern, "/api/session") {
			continue
		}
		method, path, _ := strings.Cut(r.Pattern, " ")
		path = strings.NewReplacer("{id}", mid, "{session}", "s1", "{port}", "8080").Replace(path)
		req, err := http.NewRequestWithContext(t.Context(), method, base+path, strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		if cred != "" {
			req.Header.Set("Authorization", "Bearer "+cred)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", r.Pattern, err)
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound:
		default:
			t.Errorf("HTTP %s: %s: %s", r.Pattern, resp.Status, b)
		}
		var je struct{ Error string }
		if !strings.Contains(r.Who, "(browser)") && (json.Unmarshal(b, &je) != nil || je.Error == "") {
			t.Errorf("HTTP %s: %s without a JSON error: %q", r.Pattern, resp.Status, b)
		}
		count("http refused")
	}
}
