package kloud

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/store"
)

// The audit log (docs/operations.md "Audit log"): every call of a method that changes something
// (auditedMethod, next to rpc in routes.go), every web login, and every terminal, port-forward
// and web-app connection is appended to the store's hash-chained log (kloud/store/audit.go):
// who (the caller), from where (the connection's address), what (the method or action), which
// thing (the target its params or its result name), how it ended (ok or error, with the code)
// and when. Never a secret: no params, no bodies, no error messages are recorded, only the ids
// the params name.
//
// An entry is appended after the call, before its answer goes out. When the append fails (the
// store is down), the call's own result and error are answered unchanged and kloud logs the
// entry it could not record ("audit: entry not recorded", with its fields) at error level.

// auditTimeout bounds one append, with its wait for this kloud's appends before it (a burst of
// calls queues on the embedded store's one connection).
const auditTimeout = 30 * time.Second

// auditLog is the audit log of this kloud: it appends the entries of audited calls (rpc, and
// kontrol's methods through auditKontrol), web logins and relay connections (addHTTP, add),
// prunes entries past their retention (prune, for retention.go) and serves audit.list and
// audit.verify (routes.go).
type auditLog struct {
	entries *store.Audit
	users   *store.Users // loginName: whether a failed login names a user
	now     func() time.Time
	log     *slog.Logger
}

// Actions recorded besides RPC methods (and the relays': relay.ActionTerminalOpen, ...).
const (
	auditWebLogin  = "web.login"
	auditWebLogout = "web.logout"
	auditPrune     = "audit.prune"
)

// add appends e (Time, Seq and hashes are the store's). A failure is logged, never returned:
// the audited call has already happened. After a call that failed because the store does not
// answer, the append runs in the background, so that it does not delay the call's own
// store-unavailable error (it is then most likely logged as not recorded).
func (a *auditLog) add(ctx context.Context, e store.AuditEntry, callErr error) {
	e.Time = a.now()
	e.User, e.Remote, e.Target = auditText(e.User), auditText(e.Remote), auditText(e.Target)
	do := func() {
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), auditTimeout)
		defer cancel()
		if _, err := a.entries.Append(actx, e); err != nil {
			a.log.Error("audit: entry not recorded", "action", e.Action, "user", e.User, "remote", e.Remote,
				"target", e.Target, "result", e.Result, "code", e.Code, "time", e.Time, "err", err)
		}
	}
	if callErr != nil && (store.IsUnavailable(callErr) || errors.Is(callErr, kite.ErrStoreUnavailable)) {
		go do()
		return
	}
	do()
}

// auditRPC records one call of an audited method (rpc and pluginRPC, routes.go): s.audits.rpc.
func (s *Server) auditRPC(ctx context.Context, r *kite.Request, c *Caller, params, result any, err error) {
	s.audits.rpc(ctx, r, c, params, result, err)
}

// rpc records one call of an audited method.
func (a *auditLog) rpc(ctx context.Context, r *kite.Request, c *Caller, params, result any, err error) {
	e := store.AuditEntry{Action: r.Method, Remote: remoteHost(r.Conn.Remote()), Result: store.AuditOK}
	if c != nil {
		e.User = c.Username
	} else {
		e.User = r.Username()
	}
	e.Target = auditTarget(r.Method, params)
	if createsTarget(r.Method) {
		if t := createdTarget(r.Method, result); t != "" {
			e.Target = t
		}
	} else if e.Target == "" {
		e.Target = auditTarget(r.Method, result)
	}
	if err != nil {
		e.Result, e.Code = store.AuditError, kite.ToWire(err).Code
	}
	a.add(ctx, e, err)
}

// createsTarget: methods whose result names the thing they made (stack.create's stack rather
// than its params' template).
func createsTarget(method string) bool {
	_, verb, _ := strings.Cut(method, ".")
	return verb == "create" || verb == "add" || verb == "snapshot"
}

// createdTarget is the target a create's result names: its "id" (template.create's template,
// credential.add's credential), the id of its field named after the method's namespace
// (stack.create's {stack: {id}}), else its first id field (user.add's username).
func createdTarget(method string, result any) string {
	ns, _, _ := strings.Cut(method, ".")
	rv := reflect.ValueOf(result)
	for rv.Kind() == reflect.Pointer || rv.Kind() == reflect.Interface {
		if rv.IsNil() {
			return ""
		}
		rv = rv.Elem()
	}
	if rv.Kind() != reflect.Struct {
		return ""
	}
	for i := range rv.NumField() {
		f := rv.Type().Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if !f.IsExported() {
			continue
		}
		switch {
		case name == "id" && f.Type.Kind() == reflect.String && rv.Field(i).String() != "":
			return ns + "/" + rv.Field(i).String()
		case name == ns && (f.Type.Kind() == reflect.Struct || f.Type.Kind() == reflect.Pointer):
			if t := createdTarget(method, rv.Field(i).Interface()); strings.HasPrefix(t, ns+"/") {
				return t
			}
		}
	}
	return auditTarget(method, result)
}

// auditIDFields are the params' and results' fields that name a target, most specific first,
// with the kind of thing they name ("" for "id": the method's namespace).
var auditIDFields = []struct{ json, kind string }{
	{"snapshotId", "snapshot"},
	{"machineId", "machine"},
	{"stackId", "stack"},
	{"templateId", "template"},
	{"credentialId", "credential"},
	{"jobId", "job"},
	{"slug", "team"},
	{"team", "team"}, // team.addMember: the team, not the member
	{"username", "user"},
	{"user", "user"},
	{"provider", "provider"},
	{"kiteId", "kite"},
	{"id", ""},
}

// auditTarget returns "kind/id" for the first field of v (a params or result struct, or a
// pointer to one; embedded structs count) that names a thing, or "". Only these string fields
// are read: nothing else of the params reaches the log.
func auditTarget(method string, v any) string {
	fields := map[string]string{}
	var walk func(rv reflect.Value)
	walk = func(rv reflect.Value) {
		for rv.Kind() == reflect.Pointer || rv.Kind() == reflect.Interface {
			if rv.IsNil() {
				return
			}
			rv = rv.Elem()
		}
		if rv.Kind() != reflect.Struct {
			return
		}
		rt := rv.Type()
		for i := range rt.NumField() {
			f := rt.Field(i)
			if !f.IsExported() {
				continue
			}
			if f.Anonymous {
				walk(rv.Field(i))
				continue
			}
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "" || f.Type.Kind() != reflect.String {
				continue
			}
			if _, seen := fields[name]; !seen && rv.Field(i).String() != "" {
				fields[name] = rv.Field(i).String()
			}
		}
	}
	walk(reflect.ValueOf(v))
	for _, f := range auditIDFields {
		id := fields[f.json]
		if id == "" {
			continue
		}
		kind := f.kind
		if kind == "" {
			kind, _, _ = strings.Cut(method, ".")
		}
		return kind + "/" + id
	}
	return ""
}

// remoteHost is the host part of a remote address ("" stays "").
func remoteHost(addr string) string {
	if host, _, err := net.SplitHostPort(addr); err == nil {
		return host
	}
	return addr
}

// addHTTP records an HTTP action of user on target: ok, or an error with the HTTP status.
func (a *auditLog) addHTTP(r *http.Request, action, user, target string, status int) {
	e := store.AuditEntry{Action: action, User: user, Remote: clientIP(r), Target: target, Result: store.AuditOK}
	if status != 0 && status != http.StatusOK {
		e.Result, e.Code = store.AuditError, int64(status)
	}
	a.add(r.Context(), e, nil)
}

// list serves audit.list.
func (a *auditLog) list(ctx context.Context, c *Caller, _ *kite.Request, p *api.AuditListParams) (api.AuditListResult, error) {
	es, err := a.entries.List(ctx, store.AuditFilter{User: p.User, Action: p.Action, Target: p.Target, Since: p.Since, Limit: p.Limit})
	if err != nil {
		return api.AuditListResult{}, err
	}
	res := api.AuditListResult{Entries: make([]api.AuditEntry, 0, len(es))}
	for _, e := range es {
		res.Entries = append(res.Entries, api.AuditEntry{Seq: e.Seq, Time: e.Time.UTC(), User: e.User, Remote: e.Remote,
			Action: e.Action, Target: e.Target, Result: e.Result, Code: e.Code, DurationMs: e.Duration, Bytes: e.Bytes,
			PrevHash: e.PrevHash, Hash: e.Hash})
	}
	return res, nil
}

// verify serves audit.verify.
func (a *auditLog) verify(ctx context.Context, c *Caller, _ *kite.Request, _ *api.NoParams) (api.AuditVerifyResult, error) {
	v, err := a.entries.Verify(ctx)
	if err != nil {
		return api.AuditVerifyResult{}, err
	}
	return api.AuditVerifyResult{OK: v.OK, From: v.From, Checked: v.Checked, Head: v.Head, HeadHash: v.HeadHash,
		BadSeq: v.BadSeq, Problem: v.Problem}, nil
}

// prune deletes the audit entries older than before (retention.go: Retention.Audit ago) and
// records that it did, with the new checkpoint.
func (a *auditLog) prune(ctx context.Context, before time.Time, o store.PruneOptions) (int64, error) {
	n, cp, err := a.entries.Prune(ctx, before, o)
	if n > 0 {
		a.add(ctx, store.AuditEntry{Action: auditPrune, User: "kloud", Target: fmt.Sprintf("audit/%d", cp), Result: store.AuditOK}, nil)
	}
	return n, err
}

// auditStatus is the HTTP status an error of an HTTP handler answers with.
func auditStatus(err error) int {
	var he *httpError
	if errors.As(err, &he) {
		return he.code
	}
	code, _ := errStatus(err)
	return code
}

// loginName is the user a failed login names, as the audit log records it: the name if
// such a user exists, else "" (people type their password into the username field; an unknown
// name is not recorded, so that such a password never reaches the log).
func (a *auditLog) loginName(ctx context.Context, name string) string {
	if _, err := a.users.Get(ctx, name); err == nil {
		return name
	}
	return ""
}

// auditStatusOf is auditStatus, and 200 for no error.
func auditStatusOf(err error) int {
	if err == nil {
		return http.StatusOK
	}
	return auditStatus(err)
}

// auditPortTarget names a machine's port: "machine/<id>:<port>".
func auditPortTarget(r *http.Request, port int) string {
	return "machine/" + r.PathValue("id") + ":" + strconv.Itoa(port)
}

// auditKontrol is kontrol's Wrap (New): auditKontrolMethod appending to s.audits, which is
// looked up at each call (kontrol, built first, wraps its methods before the audit log exists).
func (s *Server) auditKontrol(method string, h kite.Handler) kite.Handler {
	return auditKontrolMethod(method, h, func(ctx context.Context, e store.AuditEntry, err error) { s.audits.add(ctx, e, err) })
}

// auditKontrolMethod wraps the kontrol methods kloud hosts that change something (kite keys
// made, signing keys rotated and retired, credentials revoked) so that each call is audited
// (appended with add) like a route of rpcRoutes. kontrol.register (agents, at every connect),
// getKey, query and getToken change nothing kept and are not. The target comes from the params'
// ids only; a result (a new kite key) is never looked at.
func auditKontrolMethod(method string, h kite.Handler, add func(context.Context, store.AuditEntry, error)) kite.Handler {
	if !auditedKontrolMethod(method) {
		return h
	}
	return kite.HandlerFunc(func(ctx context.Context, r *kite.Request) (any, error) {
		res, err := h.ServeKite(ctx, r)
		var p struct {
			Username string `json:"username"`
			KiteID   string `json:"kiteId"`
			KID      string `json:"kid"`
			JTI      string `json:"jti"`
		}
		_ = json.Unmarshal(r.Params, &p) // positional or malformed params: no target
		e := store.AuditEntry{Action: method, User: r.Username(), Remote: remoteHost(r.Conn.Remote()), Result: store.AuditOK}
		switch {
		case p.KiteID != "":
			e.Target = "kite/" + p.KiteID
		case p.Username != "":
			e.Target = "user/" + p.Username
		case p.KID != "":
			e.Target = "key/" + p.KID
		case p.JTI != "":
			e.Target = "token/" + p.JTI
		}
		werr := wireError(err)
		if werr != nil {
			e.Result, e.Code = store.AuditError, kite.ToWire(werr).Code
		}
		add(ctx, e, werr)
		return res, err
	})
}

// auditedKontrolMethod decides kontrol's methods as auditDecisions decides kloud's
// (TestEveryRouteIsAuditDecided checks every one of api.KontrolMethods is decided).
func auditedKontrolMethod(method string) bool {
	audited, known := auditKontrolDecisions()[method]
	return !known || audited
}

// auditKontrolDecisions maps each kontrol method to whether it is audited.
func auditKontrolDecisions() map[string]bool {
	return map[string]bool{
		api.MethodKontrolRegister: false, api.MethodKontrolQuery: false, api.MethodKontrolGetToken: false,
		api.MethodKontrolGetKey: false, api.MethodKontrolCreateKey: true, api.MethodKontrolRotateKey: true,
		api.MethodKontrolRetireKey: true, api.MethodKontrolRevoke: true,
	}
}

// auditMaxText bounds a text field of an entry (ids are far shorter).
const auditMaxText = 200

// auditText makes a caller-chosen text safe to show in a table or a log line: control and
// other unprintable characters are escaped as Go does (\n, \x00, \u2028), so an id with a
// newline cannot forge a line of `kloud audit`, and it is cut at auditMaxText bytes.
func auditText(s string) string {
	clean := true
	for _, r := range s {
		if !unicode.IsPrint(r) {
			clean = false
			break
		}
	}
	if !clean {
		q := strconv.Quote(s)
		s = q[1 : len(q)-1]
	}
	if len(s) > auditMaxText {
		cut := auditMaxText
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	return s
}
