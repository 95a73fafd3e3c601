package kloud

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"time"

	"github.com/kloud-dev/kloud/internal/version"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/klient/klientapi"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/provider"
)

// The route table: every RPC method kloud serves with its params type, handler and who may
// call it; every HTTP route; every job kind; every background task. Nothing registers itself
// elsewhere. The params and result types are in package api (kloud/api), the wire contract in
// docs/protocol.md; kontrol's methods, which kloud hosts on the same kite, are kontrol's own
// table (kontrol/kontrol.go, listed in api.KontrolMethods).

// Who may call a method. Machine agents (kite keys with an agent id) may call no kloud method:
// every route is wrapped in kitekey.AgentGate(…, false), default deny; so are provider plugins
// (plugin keys), which may call only the routes opened to them with kitekey.Gate(h, KindPluginKey).
type Who string

const (
	// AnyUser: any authenticated user; the handler decides what they may see and change
	// (owner, team member, team admin, share grant; kloud administrators may do everything).
	AnyUser Who = "any user"
	// AdminOnly: kloud administrators only, checked here before the handler (which checks it
	// again).
	AdminOnly Who = "kloud admins"
	// PluginsOnly: provider plugins (plugin keys) only; users and agents get -32002.
	PluginsOnly Who = "provider plugins"
)

// Route is one RPC method of the table.
type Route struct {
	Method string       // an api.Method* constant
	Who    Who          // who may call it
	Params reflect.Type // its params type (package api)
	h      kite.Handler
	opts   []kite.MethodOption
}

// rpc makes a Route: params are bound strictly into P (and validated), the caller is resolved
// (agents refused), the Who is checked, then fn runs.
func rpc[P any](s *Server, method string, who Who, fn func(ctx context.Context, c *Caller, r *kite.Request, p *P) (any, error), opts ...kite.MethodOption) Route {
	h := kite.Typed(func(ctx context.Context, r *kite.Request, p *P) (any, error) {
		c, err := s.caller(ctx, r)
		if err != nil {
			return nil, wireError(err)
		}
		if who == AdminOnly && !c.Admin {
			return nil, fmt.Errorf("%s is for kloud administrators: %w", method, kite.ErrPermission)
		}
		res, err := fn(ctx, c, r, p)
		return res, wireError(err) // store errors get their kite codes here, once (errors.go)
	})
	return Route{Method: method, Who: who, Params: reflect.TypeFor[P](), h: kitekey.AgentGate(h, false), opts: opts}
}

// pluginRPC makes a Route for plugin keys only: kitekey.Gate lets plugin keys through (and
// refuses agents), the handler refuses users.
func pluginRPC[P any](method string, fn func(ctx context.Context, r *kite.Request, p *P) (any, error)) Route {
	h := kite.Typed(func(ctx context.Context, r *kite.Request, p *P) (any, error) {
		res, err := fn(ctx, r, p)
		return res, wireError(err)
	})
	return Route{Method: method, Who: PluginsOnly, Params: reflect.TypeFor[P](), h: kitekey.Gate(h, kitekey.KindPluginKey)}
}

// rpcRoutes lists every kloud method.
func (s *Server) rpcRoutes() []Route {
	long := kite.WithTimeout(10 * time.Minute) // terraform plan
	return []Route{
		rpc(s, api.MethodVersion, AnyUser, s.kloudVersion),

		// users.go
		rpc(s, api.MethodUserAdd, AdminOnly, s.userAdd),
		rpc(s, api.MethodUserList, AnyUser, s.userList),
		rpc(s, api.MethodUserWhoami, AnyUser, s.userWhoami),
		rpc(s, api.MethodUserSetPassword, AnyUser, s.userSetPassword), // own; admins anyone's
		rpc(s, api.MethodTeamCreate, AnyUser, s.teamCreate),
		rpc(s, api.MethodTeamList, AnyUser, s.teamList),
		rpc(s, api.MethodTeamAddMember, AnyUser, s.teamAddMember),       // team admins
		rpc(s, api.MethodTeamRemoveMember, AnyUser, s.teamRemoveMember), // team admins; members leave

		// credentials.go, credential_bootstrap.go
		rpc(s, api.MethodProviderDescribe, AnyUser, s.providerDescribe),
		rpc(s, api.MethodProviderList, AnyUser, s.providerList),
		rpc(s, api.MethodProviderKeyCreate, AdminOnly, s.providerKeyCreate), // audited in the log
		rpc(s, api.MethodCredentialAdd, AnyUser, s.credentialAdd),           // team members
		rpc(s, api.MethodCredentialList, AnyUser, s.credentialList),
		rpc(s, api.MethodCredentialDescribe, AnyUser, s.credentialDescribe),
		rpc(s, api.MethodCredentialRemove, AnyUser, s.credentialRemove), // owner, team admins
		rpc(s, api.MethodCredentialUpdate, AnyUser, s.credentialUpdate), // owner, team admins
		rpc(s, api.MethodCredentialAuthenticate, AnyUser, s.credentialAuthenticate),
		rpc(s, api.MethodCredentialBootstrap, AnyUser, s.credentialBootstrap), // owner, team admins

		// templates.go, policy.go
		rpc(s, api.MethodTemplateCreate, AnyUser, s.templateCreate), // team members; trust: admins
		rpc(s, api.MethodTemplateUpdate, AnyUser, s.templateUpdate), // owner, team admins
		rpc(s, api.MethodTemplateGet, AnyUser, s.templateGet),
		rpc(s, api.MethodTemplateList, AnyUser, s.templateList),
		rpc(s, api.MethodTemplateDelete, AnyUser, s.templateDelete), // owner, team admins
		rpc(s, api.MethodTemplateTrust, AdminOnly, s.templateTrust),
		rpc(s, api.MethodTemplateUntrust, AdminOnly, s.templateUntrust),

		// stacks.go, reconcile.go
		rpc(s, api.MethodStackPlan, AnyUser, s.stackPlan, long),
		rpc(s, api.MethodStackCreate, AnyUser, s.stackCreate, long),
		rpc(s, api.MethodStackApply, AnyUser, s.stackApply), // owner, team admins
		rpc(s, api.MethodStackDescribe, AnyUser, s.stackDescribe),
		rpc(s, api.MethodStackList, AnyUser, s.stackList),
		rpc(s, api.MethodStackReset, AdminOnly, s.stackReset),
		// stacks_update.go: owner, team admins
		rpc(s, api.MethodStackUpdate, AnyUser, s.stackUpdate),
		rpc(s, api.MethodStackScale, AnyUser, s.stackScale),

		// machines.go, shares.go
		rpc(s, api.MethodMachineList, AnyUser, s.machineList), // owner, shared users, team admins
		rpc(s, api.MethodMachineInfo, AnyUser, s.machineInfo, kite.WithTimeout(time.Minute)),
		rpc(s, api.MethodMachineStart, AnyUser, s.machinePower(provider.MethodStart)), // owner, team admins, full share
		rpc(s, api.MethodMachineStop, AnyUser, s.machinePower(provider.MethodStop)),
		rpc(s, api.MethodMachineShare, AnyUser, s.machineShare), // owner, team admins
		rpc(s, api.MethodMachineUnshare, AnyUser, s.machineUnshare),
		rpc(s, api.MethodMachineShares, AnyUser, s.machineShares),
		// ports.go: the machine's firewall (provider capability "firewall")
		rpc(s, api.MethodMachinePortsList, AnyUser, s.machinePortsList),           // as machine.list
		rpc(s, api.MethodMachinePortsOpen, AnyUser, s.machinePortsChange(true)),   // owner, team admins, full share
		rpc(s, api.MethodMachinePortsClose, AnyUser, s.machinePortsChange(false)), // owner, team admins, full share

		// snapshots.go: the owner, team admins, full share; snapshots are the owner's (kloud admins)
		rpc(s, api.MethodMachineSnapshot, AnyUser, s.machineSnapshot),
		rpc(s, api.MethodMachineSnapshots, AnyUser, s.machineSnapshots),
		rpc(s, api.MethodMachineRestore, AnyUser, s.machineRestore),
		rpc(s, api.MethodSnapshotDelete, AnyUser, s.snapshotDelete, kite.WithTimeout(5*time.Minute)),

		// quota.go: quotas of users and teams
		rpc(s, api.MethodQuotaSet, AdminOnly, s.quotaSet),
		rpc(s, api.MethodQuotaShow, AnyUser, s.quotaShow), // the user itself, team members, kloud admins

		// jobs.go: the job's owner, kloud admins
		rpc(s, api.MethodJobGet, AnyUser, s.jobGet),
		rpc(s, api.MethodJobWatch, AnyUser, s.jobWatch),
		rpc(s, api.MethodJobList, AnyUser, s.jobList),
		rpc(s, api.MethodJobCancel, AnyUser, s.jobCancel),

		// gc.go: the providers' resources kloud no longer wants
		rpc(s, api.MethodGCRun, AdminOnly, s.gcRun, long),

		// plugins.go: provider plugins register (plugin keys only)
		pluginRPC(api.MethodPluginRegister, s.pluginRegister),

		// idle.go: idle stop (issue 19 §5)
		rpc(s, api.MethodMachineSet, AnyUser, s.machineSet), // owner, team admins
	}
}

// Routes returns kloud's RPC methods (for tests and docs).
func (s *Server) Routes() []Route { return s.rpcRoutes() }

// httpRoute is one HTTP route and who may use it.
type httpRoute struct {
	pattern string
	who     string
	h       http.Handler
}

// httpRoutes lists kloud's HTTP routes. The web UI (package web) adds "/" through Handle, and
// providers mount their own services (the local provider's machine API) below.
func (s *Server) httpRoutes() []httpRoute {
	login := newLoginLimiter(loginFailLimit, loginWindow)
	return []httpRoute{
		{"/kite", "kite handshake (kite key or session)", s.Kite},
		{"GET /kite/keys", "anyone", http.HandlerFunc(s.serveKeys)},
		{"GET /healthz", "anyone", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })},
		{"GET /readyz", "anyone", http.HandlerFunc(s.serveReadyz)}, // health.go
		{"GET /dl/klient", "anyone", http.HandlerFunc(s.serveKlient)},
		// web_api_login.go
		{"POST /api/login", "anyone (password; rate limited)", s.handleLogin(login)},
		{"POST /api/logout", "session", http.HandlerFunc(s.handleLogout)},
		{"GET /api/session", "session cookie", http.HandlerFunc(s.handleSession)},
		// terminal.go: users who may open a terminal on the machine; klient attaches with a ticket
		{"GET /api/machines/{id}/terminal", "session or kite key; owner, team admin, share", http.HandlerFunc(s.term.serveTerminal)},
		{"GET /api/machines/{id}/sessions", "session or kite key; as terminal", http.HandlerFunc(s.term.serveSessions)},
		{"DELETE /api/machines/{id}/sessions/{session}", "session or kite key; as terminal", http.HandlerFunc(s.term.serveKill)},
		{"POST /api/machines/{id}/sessions/{session}/rename", "session or kite key; as terminal", http.HandlerFunc(s.term.serveRename)},
		{"GET " + klientapi.AttachPath, "the machine's klient, with a ticket", http.HandlerFunc(s.term.serveAttach)},
		// portforward.go: a machine's ports for its owner and terminal/full shares (web apps are
		// served on their own hosts, Server.AppURL, before this table)
		{"GET /api/machines/{id}/ports/{port}/tcp", "session or kite key; owner, terminal or full share", http.HandlerFunc(s.serveTCP)},
		{"GET /api/machines/{id}/ports/{port}/open", "session (browser); owner, terminal or full share", http.HandlerFunc(s.apps.serveOpen)},
		// plugins.go: each provider's own HTTP service (provider.HandlerPrefix), looked up per
		// request, so a plugin registering later is served; the service authenticates itself
		{"/provider/", "the provider's service decides", http.HandlerFunc(s.serveProvider)},
	}
}

// jobKinds lists every kind of durable job (jobs.go): how it runs and how a job whose runner
// died is resumed.
func (s *Server) jobKinds() map[string]jobKind {
	power := func(method string) jobKind {
		return jobKind{
			run: func(ctx context.Context, j *jobCtx) (map[string]any, error) {
				return s.runMachinePower(ctx, j, method, false)
			},
			recover: func(ctx context.Context, j *jobCtx) (map[string]any, error) {
				return s.runMachinePower(ctx, j, method, true)
			},
		}
	}
	return map[string]jobKind{
		jobStackApply: {
			run:     func(ctx context.Context, j *jobCtx) (map[string]any, error) { return s.runStackApply(ctx, j, false) },
			recover: func(ctx context.Context, j *jobCtx) (map[string]any, error) { return s.runStackApply(ctx, j, true) },
		},
		jobStackUpdate: { // stacks_update.go
			run:     func(ctx context.Context, j *jobCtx) (map[string]any, error) { return s.runStackUpdate(ctx, j, false) },
			recover: func(ctx context.Context, j *jobCtx) (map[string]any, error) { return s.runStackUpdate(ctx, j, true) },
		},
		"machine." + provider.MethodStart: power(provider.MethodStart),
		"machine." + provider.MethodStop:  power(provider.MethodStop),
		// snapshots.go
		jobMachineSnapshot: {
			run: func(ctx context.Context, j *jobCtx) (map[string]any, error) {
				return s.runMachineSnapshot(ctx, j, false)
			},
			recover: func(ctx context.Context, j *jobCtx) (map[string]any, error) {
				return s.runMachineSnapshot(ctx, j, true)
			},
		},
		jobMachineRestore: {
			run: func(ctx context.Context, j *jobCtx) (map[string]any, error) {
				return s.runMachineRestore(ctx, j, false)
			},
			recover: func(ctx context.Context, j *jobCtx) (map[string]any, error) { return s.runMachineRestore(ctx, j, true) },
		},
		bootstrapJobKind: {
			run:     func(ctx context.Context, j *jobCtx) (map[string]any, error) { return s.runBootstrap(ctx, j, false) },
			recover: func(ctx context.Context, j *jobCtx) (map[string]any, error) { return s.runBootstrap(ctx, j, true) },
		},
	}
}

// backgroundTasks run while the server serves, each in its own goroutine until ctx ends.
func (s *Server) backgroundTasks() []func(ctx context.Context) {
	return []func(ctx context.Context){
		s.presence.run,   // storeadapt.go: kontrol's presence written to the store
		s.runJobsLoop,    // jobs.go: recover interrupted jobs; reconcile.go: stuck states
		s.trackAgents,    // agents.go: machines' agent status from kontrol's registrations
		s.closeTerminals, // terminal.go: close every web terminal at shutdown
		s.apps.closeIdle, // portforward.go: drop the web apps' idle tunnels at shutdown
		s.retain,         // retention.go: prune finished jobs, expired revocations, stale kite records
		s.runPlugins,     // plugins.go: launch and supervise the plugin directory's providers
		s.runGC,          // gc.go: sweep the providers' resources kloud no longer wants
		s.monitorStore,   // health.go: log a store outage once, and its end
		s.runIdle,        // idle.go: write activity, warn and stop idle machines
	}
}

// routes registers the table: the RPC methods on the kite, the HTTP routes on the mux.
func (s *Server) routes() {
	for _, r := range s.rpcRoutes() {
		s.Kite.Handle(r.Method, r.h, r.opts...)
	}
	for _, r := range s.httpRoutes() {
		s.mux.Handle(r.pattern, r.h)
	}
}

// kloudVersion serves kloud.version.
func (s *Server) kloudVersion(ctx context.Context, c *Caller, _ *kite.Request, _ *api.NoParams) (any, error) {
	return api.VersionResult{Version: version.Version}, nil
}

func (s *Server) serveKeys(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(s.Kontrol.PublicKeys())
}

func (s *Server) serveKlient(w http.ResponseWriter, r *http.Request) {
	if s.klientSum == "" {
		http.Error(w, "this kloud has no klient binary to serve", http.StatusNotFound)
		return
	}
	w.Header().Set("X-Checksum-Sha256", s.klientSum)
	http.ServeFile(w, r, s.opts.KlientBin)
}
