package kloud

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/klient/klientapi"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/snapshots"
	"github.com/kloud-dev/kloud/kloud/stackbuild"
	"github.com/kloud-dev/kloud/provider"
)

// The route table: every RPC method kloud serves with its params type, handler and who may
// call it; every HTTP route; every job kind; every background task. Nothing registers itself
// elsewhere. Each method is routed by its descriptor in package api (api.RPCStackList: its
// name, params and result types, which the typed client calls through too), the wire contract in
// docs/protocol.md; kontrol's methods, which kloud hosts on the same kite, are kontrol's own
// table (kontrol/kontrol.go, listed in api.KontrolMethods).

// Who may call a method, in the roles of docs/operations.md ("Single sign-on and roles"):
// owners (kloud administrators), template admins, auditors and members (any user). Machine
// agents (kite keys with an agent id) may call no kloud method: every route is wrapped in
// kitekey.AgentGate(…, false), default deny; so are provider plugins (plugin keys), which may
// call only the routes opened to them with kitekey.Gate(h, KindPluginKey).
type Who string

const (
	// Members: any user but auditors; the handler decides what they may change (owner, team
	// member, team admin, share grant; owners may do everything). A method that changes
	// something is Members: auditors get -32002.
	Members Who = "members"
	// MembersRead: any user, a method that changes nothing; the handler shows what the caller
	// may see, and owners and auditors see everything.
	MembersRead Who = "members (read); owners and auditors see all"
	// Owners: owners only (today's kloud administrators), checked here before the handler (which
	// may check it again).
	Owners Who = "owners"
	// TemplateAdmins: owners and template admins (template trust and caps).
	TemplateAdmins Who = "owners, template admins"
	// OwnersAuditors: owners and auditors, for methods that change nothing and are for them only
	// (audit.list, audit.verify); an auditor calls them as an owner would.
	OwnersAuditors Who = "owners, auditors (read)"
	// PluginsOnly: provider plugins (plugin keys) only; users and agents get -32002.
	PluginsOnly Who = "provider plugins"
	// ReplicasOnly: other kloud replicas (replica keys, mesh.go) only; users, agents and
	// plugins get -32002.
	ReplicasOnly Who = "kloud replicas"

	// AnyUser and AdminOnly are the names before roles: Members and Owners.
	AnyUser   = Members
	AdminOnly = Owners
)

// ReadOnly reports whether a method of this Who changes nothing (auditors may call it).
func (w Who) ReadOnly() bool { return w == MembersRead || w == OwnersAuditors }

// authorize checks the route's Who for the caller before the handler runs; an auditor in a
// read-only method is given an owner's view (Caller.Admin).
func authorize(c *Caller, who Who, method string) error {
	owner := c.KloudRole == model.RoleOwner || c.Admin
	switch who {
	case Owners:
		if !owner {
			return fmt.Errorf("%s is for kloud owners (administrators): %w", method, kite.ErrPermission)
		}
	case TemplateAdmins:
		if !owner && c.KloudRole != model.RoleTemplateAdmin {
			return fmt.Errorf("%s is for kloud owners (administrators) and template admins: %w", method, kite.ErrPermission)
		}
	case OwnersAuditors:
		if !owner && c.KloudRole != model.RoleAuditor {
			return fmt.Errorf("%s is for kloud owners (administrators) and auditors: %w", method, kite.ErrPermission)
		}
		c.Admin = true
	case MembersRead:
		if c.KloudRole == model.RoleAuditor {
			c.Admin = true
		}
	case Members:
		if c.KloudRole == model.RoleAuditor && !owner {
			return fmt.Errorf("%s changes something, and auditors change nothing: %w", method, kite.ErrPermission)
		}
	default:
		return fmt.Errorf("%s: no authorization in the route table: %w", method, kite.ErrPermission)
	}
	return nil
}

// Route is one RPC method of the table.
type Route struct {
	Method string       // an api.Method* constant
	Who    Who          // who may call it
	Params reflect.Type // its params type (package api)
	Result reflect.Type // its result type (package api), as the typed client decodes it
	h      kite.Handler
	opts   []kite.MethodOption
}

// rpc makes the Route of method m: the caller is resolved (agents refused), its rate limit
// checked (a refused call is not audited: a flood must not fill the log) and the Who checked,
// then params are bound strictly into P (and validated), then fn runs. Authorization comes
// before validation, so a caller the Who refuses gets -32002 whatever it sends. fn answers R,
// the type the typed client decodes (m.Call): a handler that answers another does not compile.
func rpc[P, R any](s *Server, m api.Method[P, R], who Who, fn func(ctx context.Context, c *Caller, r *kite.Request, p *P) (R, error), opts ...kite.MethodOption) Route {
	method := m.Name
	audited := auditedMethod(method)
	h := kite.HandlerFunc(func(ctx context.Context, r *kite.Request) (any, error) {
		c, err := s.caller(ctx, r)
		p := new(P)
		var res any
		if err == nil {
			if err := s.checkRate(c, method); err != nil { // ratelimit.go
				return nil, err
			}
			err = authorize(c, who, method)
		}
		if err == nil {
			if err := r.Bind(p); err != nil {
				return nil, err // invalid params: nothing was done, nothing to audit
			}
			res, err = fn(ctx, c, r, p)
		}
		err = wireError(err) // store errors get their kite codes here, once (errors.go)
		if audited {
			s.auditRPC(ctx, r, c, p, res, err)
		}
		return res, err
	})
	return Route{Method: method, Who: who, Params: reflect.TypeFor[P](), Result: reflect.TypeFor[R](), h: kitekey.AgentGate(h, false), opts: opts}
}

// deref is a handler's answer from a function that returns a pointer: *p, or R's zero value
// when p is nil (with the error, which the caller gets instead).
func deref[R any](p *R, err error) (R, error) {
	if p == nil {
		var zero R
		return zero, err
	}
	return *p, err
}

// auditedMethod says whether each call of method is recorded in the audit log (audit.go): the
// methods that change something are; those that only read are not. Every route is decided here
// (TestEveryRouteIsAuditDecided); a method missing from the list is audited.
func auditedMethod(method string) bool {
	readOnly, known := auditDecisions()[method]
	return !known || !readOnly
}

// auditDecisions maps every method to whether it only reads (true: not audited).
func auditDecisions() map[string]bool {
	return map[string]bool{
		api.MethodVersion: true, api.MethodKloudDoctor: false, // doctor.go writes a scratch document
		// users.go
		api.MethodUserAdd: false, api.MethodUserList: true, api.MethodUserWhoami: true, api.MethodUserSetPassword: false,
		api.MethodUserSetRole: false,
		api.MethodTeamCreate:  false, api.MethodTeamList: true, api.MethodTeamAddMember: false, api.MethodTeamRemoveMember: false,
		// credentials.go; authenticate sends a credential to its provider
		api.MethodProviderDescribe: true, api.MethodProviderList: true, api.MethodProviderKeyCreate: false,
		api.MethodCredentialAdd: false, api.MethodCredentialList: true, api.MethodCredentialDescribe: true,
		api.MethodCredentialRemove: false, api.MethodCredentialUpdate: false, api.MethodCredentialAuthenticate: false,
		api.MethodCredentialBootstrap: false,
		// templates.go
		api.MethodTemplateCreate: false, api.MethodTemplateUpdate: false, api.MethodTemplateGet: true,
		api.MethodTemplateList: true, api.MethodTemplateDelete: false, api.MethodTemplateTrust: false,
		api.MethodTemplateUntrust: false, api.MethodTemplateParameters: true,
		// stacks.go: a plan runs the template's providers (terraform plan)
		api.MethodStackPlan: false, api.MethodStackPlanJob: false, api.MethodStackCreate: false, api.MethodStackApply: false,
		api.MethodStackDescribe: true, api.MethodStackList: true, api.MethodStackReset: false,
		api.MethodStackUpdate: false, api.MethodStackScale: false,
		// machines.go, shares.go, ports.go, snapshots.go
		api.MethodMachineList: true, api.MethodMachineInfo: true, api.MethodMachineStart: false, api.MethodMachineSet: false,
		api.MethodMachineStop: false, api.MethodMachineShare: false, api.MethodMachineUnshare: false,
		api.MethodMachineShares: true, api.MethodMachinePortsList: true, api.MethodMachinePortsOpen: false,
		api.MethodMachinePortsClose: false, api.MethodMachineSnapshot: false, api.MethodMachineSnapshots: true,
		api.MethodMachineRestore: false, api.MethodSnapshotDelete: false,
		api.MethodMachineUpgradeAgent: false, // agentupgrade.go
		// buckets.go: bucket.credentials reads (and its answer holds a key: not in the audit log)
		api.MethodBucketList: true, api.MethodBucketCredentials: true, api.MethodBucketGrant: false,
		api.MethodBucketRevoke: false, api.MethodBucketDelete: false,
		// quota.go, jobs.go, gc.go (a dry run too), plugins.go
		api.MethodQuotaSet: false, api.MethodQuotaShow: true,
		api.MethodPoolSet: false, api.MethodPoolList: true, api.MethodPoolDelete: false, // pools.go
		api.MethodJobGet: true, api.MethodJobWatch: true, api.MethodJobList: true, api.MethodJobCancel: false,
		api.MethodGCRun: false, api.MethodPluginRegister: false,
		// audit.go
		api.MethodAuditList: true, api.MethodAuditVerify: true,
		// eventfeed.go: a stream of what changed
		api.MethodEventWatch: true,
		// mesh.go: a hop between replicas; the user's call is audited where it arrived
		api.MethodReplicaAgentCall: true, api.MethodReplicaPluginCall: true,
	}
}

// pluginRPC makes the Route of method m for plugin keys only: kitekey.Gate lets plugin keys
// through (and refuses agents), the handler refuses users. fn answers m's R, as rpc's.
func pluginRPC[P, R any](s *Server, m api.Method[P, R], fn func(ctx context.Context, r *kite.Request, p *P) (R, error)) Route {
	method := m.Name
	h := kite.Typed(func(ctx context.Context, r *kite.Request, p *P) (any, error) {
		res, err := fn(ctx, r, p)
		err = wireError(err)
		if auditedMethod(method) {
			s.auditRPC(ctx, r, nil, p, res, err)
		}
		return res, err
	})
	return Route{Method: method, Who: PluginsOnly, Params: reflect.TypeFor[P](), Result: reflect.TypeFor[R](), h: kitekey.Gate(h, kitekey.KindPluginKey)}
}

// replicaRPC makes the Route of method m for replica keys only: kitekey.Gate lets replica keys
// through (and refuses agents and plugins), the handler refuses users. Not audited (the call it
// forwards is, on the replica it arrived at).
func replicaRPC[P, R any](m api.Method[P, R], fn func(ctx context.Context, r *kite.Request, p *P) (R, error)) Route {
	h := kite.HandlerFunc(func(ctx context.Context, r *kite.Request) (any, error) {
		if !kitekey.IsReplica(r.Principal()) { // before the params, as every route's Who
			return nil, fmt.Errorf("%s is for kloud replicas (replica keys): %w", r.Method, kite.ErrPermission)
		}
		p := new(P)
		if err := r.Bind(p); err != nil {
			return nil, err
		}
		return fn(ctx, r, p)
	})
	return Route{Method: m.Name, Who: ReplicasOnly, Params: reflect.TypeFor[P](), Result: reflect.TypeFor[R](), h: kitekey.Gate(h, kitekey.KindReplicaKey)}
}

// rpcRoutes lists every kloud method.
func (s *Server) rpcRoutes() []Route {
	long := kite.WithTimeout(10 * time.Minute) // terraform plan
	return []Route{
		rpc(s, api.RPCVersion, MembersRead, s.ops.kloudVersion), // doctor.go

		// users.go
		rpc(s, api.RPCUserAdd, Owners, s.users.add),
		rpc(s, api.RPCUserList, MembersRead, s.users.list),
		rpc(s, api.RPCUserWhoami, MembersRead, s.users.whoami),
		rpc(s, api.RPCUserSetPassword, Members, s.users.setPassword), // own; owners anyone's
		rpc(s, api.RPCTeamCreate, Members, s.users.teamCreate),
		rpc(s, api.RPCTeamList, MembersRead, s.users.teamList),
		rpc(s, api.RPCTeamAddMember, Members, s.users.teamAddMember),       // team admins
		rpc(s, api.RPCTeamRemoveMember, Members, s.users.teamRemoveMember), // team admins; members leave

		// credentials.go, credential_bootstrap.go
		rpc(s, api.RPCProviderDescribe, MembersRead, s.creds.providerDescribe),
		rpc(s, api.RPCProviderList, MembersRead, s.pluginAPI.list),
		rpc(s, api.RPCProviderKeyCreate, Owners, s.pluginAPI.mintKey), // audited in the log
		rpc(s, api.RPCCredentialAdd, Members, s.creds.add),            // team members
		rpc(s, api.RPCCredentialList, MembersRead, s.creds.list),
		rpc(s, api.RPCCredentialDescribe, MembersRead, s.creds.describe),
		rpc(s, api.RPCCredentialRemove, Members, s.creds.remove), // owner, team admins
		rpc(s, api.RPCCredentialUpdate, Members, s.creds.update), // owner, team admins
		rpc(s, api.RPCCredentialAuthenticate, Members, s.creds.authenticate),
		rpc(s, api.RPCCredentialBootstrap, Members, s.creds.bootstrap), // owner, team admins

		// templates.go, policy.go
		rpc(s, api.RPCTemplateCreate, Members, s.templates.create), // team members; trust: admins
		rpc(s, api.RPCTemplateUpdate, Members, s.templates.update), // owner, team admins
		rpc(s, api.RPCTemplateGet, MembersRead, s.templates.get),
		rpc(s, api.RPCTemplateList, MembersRead, s.templates.list),
		rpc(s, api.RPCTemplateParameters, MembersRead, s.templates.parameters), // params.go
		rpc(s, api.RPCTemplateDelete, Members, s.templates.delete),             // owner, team admins
		rpc(s, api.RPCTemplateTrust, TemplateAdmins, s.policy.templateTrust),
		rpc(s, api.RPCTemplateUntrust, TemplateAdmins, s.policy.templateUntrust),

		// stacks.go, reconcile.go; the jobs run in kloud/stackbuild
		rpc(s, api.RPCStackPlan, Members, s.stacks.planStack, long),
		rpc(s, api.RPCStackCreate, Members, s.stacks.create, long),
		rpc(s, api.RPCStackApply, Members, s.stacks.apply), // owner, team admins
		rpc(s, api.RPCStackDescribe, MembersRead, s.stacks.describe),
		rpc(s, api.RPCStackList, MembersRead, s.stacks.list),
		rpc(s, api.RPCStackReset, Owners, s.stacks.reset),
		// stacks_update.go: owner, team admins
		rpc(s, api.RPCStackUpdate, Members, s.stacks.update),
		rpc(s, api.RPCStackScale, Members, s.stacks.scale),

		// machines.go, shares.go
		rpc(s, api.RPCMachineList, MembersRead, s.machines.list), // owner, shared users, team admins
		rpc(s, api.RPCMachineInfo, MembersRead, s.machines.info, kite.WithTimeout(time.Minute)),
		rpc(s, api.RPCMachineStart, Members, s.machines.power(provider.MethodStart)), // owner, team admins, full share
		rpc(s, api.RPCMachineStop, Members, s.machines.power(provider.MethodStop)),
		rpc(s, api.RPCMachineShare, Members, s.shares.share), // owner, team admins
		rpc(s, api.RPCMachineUnshare, Members, s.shares.unshare),
		rpc(s, api.RPCMachineShares, MembersRead, s.shares.list),

		// buckets.go
		rpc(s, api.RPCBucketList, MembersRead, s.buckets.list),               // owner, team admins, granted users
		rpc(s, api.RPCBucketCredentials, MembersRead, s.buckets.credentials), // the key's own user only
		rpc(s, api.RPCBucketGrant, Members, s.buckets.grant),                 // owner, team admins
		rpc(s, api.RPCBucketRevoke, Members, s.buckets.revoke),
		rpc(s, api.RPCBucketDelete, Members, s.buckets.delete),
		// ports.go: the machine's firewall (provider capability "firewall")
		rpc(s, api.RPCMachinePortsList, MembersRead, s.ports.list),       // as machine.list
		rpc(s, api.RPCMachinePortsOpen, Members, s.ports.change(true)),   // owner, team admins, full share
		rpc(s, api.RPCMachinePortsClose, Members, s.ports.change(false)), // owner, team admins, full share

		// snapshots.go: the owner, team admins, full share; snapshots are the owner's (kloud admins)
		rpc(s, api.RPCMachineSnapshot, Members, s.snapshots.take),
		rpc(s, api.RPCMachineSnapshots, MembersRead, s.snapshots.list),
		rpc(s, api.RPCMachineRestore, Members, s.snapshots.restore),
		rpc(s, api.RPCSnapshotDelete, Members, s.snapshots.delete, kite.WithTimeout(5*time.Minute)),

		// quota.go: quotas of users and teams
		rpc(s, api.RPCQuotaSet, Owners, s.quotaAPI.set),
		rpc(s, api.RPCQuotaShow, MembersRead, s.quotaAPI.show), // the user itself, team members, kloud admins

		// pools.go: prebuilt stacks' pools
		rpc(s, api.RPCPoolSet, Owners, s.poolAPI.set),
		rpc(s, api.RPCPoolList, OwnersAuditors, s.poolAPI.list),
		rpc(s, api.RPCPoolDelete, Owners, s.poolAPI.delete),

		// jobs.go: the job's owner, kloud admins
		rpc(s, api.RPCJobGet, MembersRead, s.jobs.get),
		rpc(s, api.RPCJobWatch, MembersRead, s.jobs.watch),
		rpc(s, api.RPCJobList, MembersRead, s.jobs.list),
		rpc(s, api.RPCJobCancel, Members, s.jobs.cancel),

		// eventfeed.go: what changed among what the caller may see, as a stream
		rpc(s, api.RPCEventWatch, MembersRead, s.events.watch),

		// gc.go: the providers' resources kloud no longer wants
		rpc(s, api.RPCGCRun, Owners, s.ops.gcRun, long),

		// plugins.go: provider plugins register (plugin keys only)
		pluginRPC(s, api.RPCPluginRegister, s.pluginAPI.register),

		// mesh.go: a call for an agent whose connection this replica holds (replica keys only)
		replicaRPC(api.RPCReplicaAgentCall, s.mesh.agentCall),
		replicaRPC(api.RPCReplicaPluginCall, s.mesh.pluginCall), // mesh_plugins.go

		// audit.go: the audit log (owners and auditors)
		rpc(s, api.RPCAuditList, OwnersAuditors, s.audits.list),
		rpc(s, api.RPCAuditVerify, OwnersAuditors, s.audits.verify, kite.WithTimeout(5*time.Minute)),

		// roles (users.go): kloud-wide roles of users
		rpc(s, api.RPCUserSetRole, Owners, s.users.setRole),

		// stacks_plan.go: stack.plan as a durable job (team members; of a stack: owner, team admins)
		rpc(s, api.RPCStackPlanJob, Members, s.stacks.planStackJob),

		// doctor.go: kloud doctor (docs/operations.md)
		rpc(s, api.RPCKloudDoctor, Owners, s.ops.kloudDoctor, kite.WithTimeout(time.Minute)),

		// idle.go: a machine's idle stop and autostart (owner, team admins)
		rpc(s, api.RPCMachineSet, Members, s.idleAPI.machineSet),
		rpc(s, api.RPCMachineUpgradeAgent, Members, s.agents.upgrade, kite.WithTimeout(agentUpgradeTimeout+time.Minute)), // agentupgrade.go
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
	return []httpRoute{
		{"/kite", "kite handshake (kite key or session)", s.Kite},
		{"GET /kite/keys", "anyone", http.HandlerFunc(s.serveKeys)},
		{"GET /healthz", "anyone", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })},
		{"GET /readyz", "anyone", http.HandlerFunc(s.ops.serveReadyz)}, // health.go
		// metrics.go
		{"GET /metrics", "kloud admins (session or kite key); --metrics-addr: anyone there", http.HandlerFunc(s.ops.serveMetrics)},
		{"GET /dl/klient", "anyone", http.HandlerFunc(s.serveKlient)},
		// kloud/login: passwords and sessions
		{"POST /api/login", "anyone (password; rate limited)", http.HandlerFunc(s.login.HandleLogin)},
		{"POST /api/logout", "session", http.HandlerFunc(s.login.HandleLogout)},
		{"GET /api/session", "session cookie", http.HandlerFunc(s.login.HandleSession)},
		// kloud/login: OpenID Connect login (404 page when kloud serve has no --oidc-issuer)
		{"GET /api/login/methods", "anyone", http.HandlerFunc(s.login.HandleMethods)},
		{"GET " + SSOLoginPath, "anyone (starts a login at the OpenID provider)", http.HandlerFunc(s.login.HandleSSOLogin)},
		{"GET " + SSOCallbackPath, "the browser that started the login (state, nonce, PKCE)", http.HandlerFunc(s.login.HandleSSOCallback)},
		// kloud/relay (terminal.go): users who may open a terminal on the machine; klient
		// attaches with a ticket
		{"GET /api/machines/{id}/terminal", "session or kite key; owner, team admin, share", http.HandlerFunc(s.relay.ServeTerminal)},
		{"GET /api/machines/{id}/sessions", "session or kite key; as terminal", http.HandlerFunc(s.relay.ServeSessions)},
		{"DELETE /api/machines/{id}/sessions/{session}", "session or kite key; as terminal", http.HandlerFunc(s.relay.ServeKill)},
		{"POST /api/machines/{id}/sessions/{session}/rename", "session or kite key; as terminal", http.HandlerFunc(s.relay.ServeRename)},
		{"GET " + klientapi.AttachPath, "the machine's klient, with a ticket", http.HandlerFunc(s.relay.ServeAttach)},
		// kloud/relay (ports.go, apps.go): a machine's ports for its owner and terminal/full
		// shares (web apps are served on their own hosts, relay.Hub.AppURL, before this table)
		{"GET /api/machines/{id}/ports/{port}/tcp", "session or kite key; owner, terminal or full share", http.HandlerFunc(s.relay.ServeTCP)},
		{"GET /api/machines/{id}/ports/{port}/open", "session (browser); owner, terminal or full share", http.HandlerFunc(s.relay.ServeOpen)},
		// kloud/relay (ssh.go): SSH served by the machine's klient, for `kloud ssh --stdio`
		{"GET /api/machines/{id}/ssh", "session or kite key; owner, terminal or full share", http.HandlerFunc(s.relay.ServeSSH)},
		{"GET /api/machines/{id}/ssh/hostkey", "session or kite key; owner, terminal or full share", http.HandlerFunc(s.relay.ServeSSHHostKey)},
		// kloud/pluginhost: each provider's own HTTP service (provider.HandlerPrefix), looked up
		// per request, so a plugin registering later is served; the service authenticates itself
		{"/provider/", "the provider's service decides", http.HandlerFunc(s.plugins.ServeProvider)},

		// ops: backup.go (kloud backup; docs/operations.md "Backup and restore")
		{"GET /api/admin/backup", "session or kite key; kloud admins", http.HandlerFunc(s.backup.serve)},
	}
}

// jobKinds lists every kind of durable job (jobs.go): how it runs and how a job whose runner
// died is resumed, each with params and a result of its own types.
func (s *Server) jobKinds() map[string]anyJobKind {
	kinds := map[string]anyJobKind{}
	for _, k := range []anyJobKind{
		stackApplyJob,  // stackbuild: a build, or a destroy
		stackUpdateJob, // stacks_update.go
		powerJobKind(provider.MethodStart),
		powerJobKind(provider.MethodStop),
		snapshotJob, restoreJob, // snapshots.go
		planJob,       // stacks_plan.go: an interrupted plan fails ("run it again")
		bootstrapJob,  // credential_bootstrap.go
		stackClaimJob, // pools.go: a claimed pool stack's handover
	} {
		kinds[k.kindName()] = k
	}
	return kinds
}

var (
	stackApplyJob = jobKind[stackbuild.ApplyParams, stackbuild.StackResult]{name: jobStackApply,
		run: func(ctx context.Context, j *jobCtx, p stackbuild.ApplyParams) (stackbuild.StackResult, error) {
			return j.s.flow().RunApply(ctx, j, p, false)
		},
		recover: func(ctx context.Context, j *jobCtx, p stackbuild.ApplyParams) (stackbuild.StackResult, error) {
			return j.s.flow().RunApply(ctx, j, p, true)
		},
	}
	stackUpdateJob = jobKind[updateParams, stackbuild.StackResult]{name: jobStackUpdate,
		run: func(ctx context.Context, j *jobCtx, p updateParams) (stackbuild.StackResult, error) {
			return j.s.flow().RunUpdate(ctx, j, p, false)
		},
		recover: func(ctx context.Context, j *jobCtx, p updateParams) (stackbuild.StackResult, error) {
			return j.s.flow().RunUpdate(ctx, j, p, true)
		},
	}
	snapshotJob = jobKind[snapshots.Params, snapshots.SnapshotResult]{name: jobMachineSnapshot,
		run: func(ctx context.Context, j *jobCtx, p snapshots.Params) (snapshots.SnapshotResult, error) {
			return j.s.snapshots.runSnapshot(ctx, j, p, false)
		},
		recover: func(ctx context.Context, j *jobCtx, p snapshots.Params) (snapshots.SnapshotResult, error) {
			return j.s.snapshots.runSnapshot(ctx, j, p, true)
		},
	}
	restoreJob = jobKind[snapshots.Params, snapshots.RestoreResult]{name: jobMachineRestore,
		run: func(ctx context.Context, j *jobCtx, p snapshots.Params) (snapshots.RestoreResult, error) {
			return j.s.snapshots.runRestore(ctx, j, p, false)
		},
		recover: func(ctx context.Context, j *jobCtx, p snapshots.Params) (snapshots.RestoreResult, error) {
			return j.s.snapshots.runRestore(ctx, j, p, true)
		},
	}
	planJob = jobKind[planJobParams, api.StackPlanResult]{name: jobStackPlan,
		run: func(ctx context.Context, j *jobCtx, p planJobParams) (api.StackPlanResult, error) {
			return j.s.stacks.runPlanJob(ctx, j, p)
		},
	}
	bootstrapJob = jobKind[bootstrapParams, bootstrapResult]{name: bootstrapJobKind,
		run: func(ctx context.Context, j *jobCtx, p bootstrapParams) (bootstrapResult, error) {
			return j.s.creds.runBootstrap(ctx, j, p, false)
		},
		recover: func(ctx context.Context, j *jobCtx, p bootstrapParams) (bootstrapResult, error) {
			return j.s.creds.runBootstrap(ctx, j, p, true)
		},
	}
)

// powerJobKind is the kind of machine.start or machine.stop (method).
func powerJobKind(method string) jobKind[powerParams, machineResult] {
	return jobKind[powerParams, machineResult]{name: "machine." + method,
		run: func(ctx context.Context, j *jobCtx, p powerParams) (machineResult, error) {
			return j.s.machines.runPower(ctx, j, method, p, false)
		},
		recover: func(ctx context.Context, j *jobCtx, p powerParams) (machineResult, error) {
			return j.s.machines.runPower(ctx, j, method, p, true)
		},
	}
}

// backgroundTasks run while the server serves, each in its own goroutine until ctx ends.
func (s *Server) backgroundTasks() []func(ctx context.Context) {
	return []func(ctx context.Context){
		s.presence.run, // storeadapt.go: kontrol's presence written to the store
		s.runJobsLoop,  // jobs.go: recover interrupted jobs; reconcile.go: stuck states
		s.trackAgents,  // agents.go: machines' agent status from kontrol's registrations
		s.relay.Run,    // kloud/relay: at shutdown, close every web terminal and drop the web apps' idle tunnels
		s.pruner.run,   // retention.go: prune finished jobs, expired revocations, stale kite records
		s.plugins.Run,  // kloud/pluginhost: launch and supervise the plugin directory's providers
		s.ops.runGC,    // gc.go: sweep the providers' resources kloud no longer wants
		s.ops.monitor,  // health.go: log a store outage once, and its end
		s.metrics.Run,  // kloud/metrics: machines' figures and quota use for /metrics
		s.idle.Run,     // kloud/idle: write activity, warn and stop idle machines, autostart
		s.runEvents,    // eventfeed.go: the store's changes and the providers' status to the event hub
		s.revs.run,     // storeadapt.go: revocations made by other replicas, their connections closed
		s.mesh.run,     // mesh.go: this replica's record, the sweep of dead replicas
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
