// Package model holds the documents kloud keeps, one Go type per collection, with the
// vocabulary that belongs to them. They are both what kloud/store persists (BSON names) and what
// kloud/api carries on the wire (JSON names; secrets never in a JSON field), so they live in this
// leaf package that both import: the store stays free of the transport, the wire contract free
// of the database driver. Both packages, and kloud, name them through aliases.
package model

import (
	"time"

	"github.com/kloud-dev/kloud/provider/ptype"
)

// User is a person who logs in (collection users).
type User struct {
	Username     string `bson:"_id" json:"username"`
	Email        string `bson:"email,omitempty" json:"email,omitempty"`
	PasswordHash string `bson:"passwordHash,omitempty" json:"-"`
	Admin        bool   `bson:"admin,omitempty" json:"admin,omitempty"` // kloud administrator (role owner)
	// Role is the user's kloud-wide role: RoleOwner, RoleTemplateAdmin, RoleAuditor, or empty
	// for a member (users.go EffectiveRole: Admin counts as owner).
	Role string `bson:"role,omitempty" json:"role,omitempty"`
	// SSOIssuer is the OpenID provider of a user created by single sign-on (sso.go); the
	// binding to the provider's subject is in the identities collection.
	SSOIssuer string `bson:"ssoIssuer,omitempty" json:"ssoIssuer,omitempty"`
	// SSOTeams are the teams single sign-on made the user a member of (from the groups claim),
	// so a later login without the group removes only those memberships.
	SSOTeams  []string  `bson:"ssoTeams,omitempty" json:"ssoTeams,omitempty"`
	CreatedAt time.Time `bson:"createdAt" json:"createdAt"`
}

// Kloud-wide roles of a user (User.Role; docs/operations.md "Single sign-on and roles"). A user
// without one is a member.
const (
	RoleOwner         = "owner"          // today's kloud administrator: everything
	RoleTemplateAdmin = "template-admin" // members' rights, and trusts or untrusts templates
	RoleAuditor       = "auditor"        // reads everything an owner reads, changes nothing
	RoleUser          = "member"         // any user
)

// Identity binds a user created by single sign-on to the provider's (issuer, subject)
// (collection identities, _id = issuer + " " + subject): a later login of the same subject is the
// same user whatever its name or email, and another subject never becomes this user.
type Identity struct {
	ID        string    `bson:"_id" json:"id"`
	Issuer    string    `bson:"issuer" json:"issuer"`
	Subject   string    `bson:"subject" json:"subject"`
	Username  string    `bson:"username" json:"username"`
	CreatedAt time.Time `bson:"createdAt" json:"createdAt"`
}

// Team roles.
const (
	RoleAdmin  = "admin"
	RoleMember = "member"
)

// Team is a group of users sharing credentials and templates (collection teams).
type Team struct {
	Slug      string    `bson:"_id" json:"slug"`
	Title     string    `bson:"title" json:"title"`
	Members   []Member  `bson:"members" json:"members"`
	CreatedAt time.Time `bson:"createdAt" json:"createdAt"`
}

// Member is a user's membership in a team.
type Member struct {
	Username string `bson:"username" json:"username"`
	Role     string `bson:"role" json:"role"`
}

// DefaultTeam is created at first start with the admin in it.
const DefaultTeam = "default"

// File is one file of a template.
type File struct {
	Name    string `bson:"name" json:"name"`
	Content string `bson:"content" json:"content"`
}

// Credential is a provider credential (collection credentials). The value is sealed (AES-GCM,
// bound to the document id) and never leaves kloud except as Terraform variables of provider
// blocks.
type Credential struct {
	ID        string         `bson:"_id" json:"id"`
	Provider  string         `bson:"provider" json:"provider"`
	Title     string         `bson:"title" json:"title"`
	Team      string         `bson:"team" json:"team"`
	Owner     string         `bson:"owner" json:"owner"`
	Sealed    []byte         `bson:"sealed,omitempty" json:"-"`
	Public    map[string]any `bson:"public,omitempty" json:"public,omitempty"` // non-secret fields
	Secret    []string       `bson:"secretFields,omitempty" json:"secretFields,omitempty"`
	Verified  bool           `bson:"verified" json:"verified"`
	VerifyErr string         `bson:"verifyError,omitempty" json:"verifyError,omitempty"`
	Bootstrap *Bootstrap     `bson:"bootstrap,omitempty" json:"bootstrap,omitempty"`
	CreatedAt time.Time      `bson:"createdAt" json:"createdAt"`
	UpdatedAt time.Time      `bson:"updatedAt" json:"updatedAt"`
}

// Bootstrap statuses (Credential.Bootstrap.Status).
const (
	BootstrapNone       = "none"
	BootstrapRunning    = "running"
	BootstrapDone       = "done"
	BootstrapFailed     = "failed"
	BootstrapDestroying = "destroying"
	BootstrapDestroyed  = "destroyed"
)

// Bootstrap is the state of a credential's bootstrap resources.
type Bootstrap struct {
	Status     string    `bson:"status" json:"status"`      // none, running, done, failed, destroying, destroyed
	Sealed     []byte    `bson:"sealed,omitempty" json:"-"` // the outputs, sealed
	Outputs    []string  `bson:"outputs,omitempty" json:"outputs,omitempty"`
	ContentIDs []string  `bson:"contentIds,omitempty" json:"contentIds,omitempty"`
	JobID      string    `bson:"jobId,omitempty" json:"jobId,omitempty"`
	Error      string    `bson:"error,omitempty" json:"error,omitempty"`
	UpdatedAt  time.Time `bson:"updatedAt" json:"updatedAt"`

	// TFJobs are the terraformer jobs of the running bootstrap, one per template, so a job
	// recovered after a restart re-attaches to them.
	TFJobs []string `bson:"tfJobs,omitempty" json:"-"`
}

// Template is a stack template with its revisions (collection templates).
type Template struct {
	ID          string             `bson:"_id" json:"id"`
	Title       string             `bson:"title" json:"title"`
	Description string             `bson:"description,omitempty" json:"description,omitempty"`
	Team        string             `bson:"team" json:"team"`
	Owner       string             `bson:"owner" json:"owner"`
	Rev         int                `bson:"rev" json:"rev"`
	Files       []File             `bson:"files" json:"files"`
	Providers   []string           `bson:"providers,omitempty" json:"providers,omitempty"`
	Revisions   []TemplateRevision `bson:"revisions,omitempty" json:"revisions,omitempty"`
	// MaxMachines is the template's own cap on machines per stack, set by a kloud administrator
	// (template.update maxMachines; 0: kloud's global cap, kloud/limits.go).
	MaxMachines int `bson:"maxMachines,omitempty" json:"maxMachines,omitempty"`
	// Idle is the idle stop its stacks' machines get unless a machine says otherwise
	// (template.update idleTimeout, alwaysOn; kloud/idle.go).
	Idle IdleSettings `bson:"idle,omitempty" json:"idle,omitzero"`
	// Trust lifts template policy rules for given revisions (template.get shows them apart).
	Trust     []TemplateTrust `bson:"trust,omitempty" json:"-"`
	CreatedAt time.Time       `bson:"createdAt" json:"createdAt"`
	UpdatedAt time.Time       `bson:"updatedAt" json:"updatedAt"`
}

// TemplateRevision is an earlier version of a template.
type TemplateRevision struct {
	Rev       int       `bson:"rev" json:"rev"`
	Files     []File    `bson:"files" json:"files"`
	Author    string    `bson:"author" json:"author"`
	CreatedAt time.Time `bson:"createdAt" json:"createdAt"`
}

// TemplateTrust is an administrator's decision to lift template policy rules for one revision
// of a template (kloud template trust). It is bound to the revision's files by their digest.
type TemplateTrust struct {
	Rev    int       `bson:"rev" json:"rev"`
	Digest string    `bson:"digest" json:"digest"` // filesDigest of the revision's files
	Rules  []string  `bson:"rules" json:"rules"`
	Reason string    `bson:"reason" json:"reason"`
	By     string    `bson:"by" json:"by"`
	At     time.Time `bson:"at" json:"at"`
}

// StackReset is the audit record of one stack.reset.
type StackReset struct {
	By     string    `bson:"by" json:"by"`
	At     time.Time `bson:"at" json:"at"`
	From   string    `bson:"from" json:"from"`
	To     string    `bson:"to" json:"to"`
	Job    string    `bson:"job,omitempty" json:"job,omitempty"` // the stack's job at the time
	Reason string    `bson:"reason" json:"reason"`
}

// Stack states (Koding's stackstate).
const (
	StackNotInitialized = "NotInitialized"
	StackBuilding       = "Building"
	StackInitialized    = "Initialized"
	StackDestroying     = "Destroying"
	StackFailed         = "Failed"
)

// Stack is one user's instance of a template (collection stacks).
type Stack struct {
	ID          string            `bson:"_id" json:"id"`
	Title       string            `bson:"title" json:"title"`
	Team        string            `bson:"team" json:"team"`
	Owner       string            `bson:"owner" json:"owner"`
	TemplateID  string            `bson:"templateId" json:"templateId"`
	TemplateRev int               `bson:"templateRev" json:"templateRev"`
	Files       []File            `bson:"files" json:"-"`
	Credentials map[string]string `bson:"credentials,omitempty" json:"credentials,omitempty"` // provider → credential id
	Variables   map[string]string `bson:"variables,omitempty" json:"variables,omitempty"`
	// SecretSealed holds the values of the template's sensitive parameters (a JSON object in
	// -var form, as Variables), sealed by the store (AAD "stacks/<id>/secrets";
	// stackbuild.SealSecrets): given to terraform, never in a response (kloud/params.go), never
	// in the store in the clear.
	SecretSealed []byte `bson:"secretSealed,omitempty" json:"-"`
	// Preset is the template preset the stack was created with ("" for none).
	Preset   string   `bson:"preset,omitempty" json:"preset,omitempty"`
	State    string   `bson:"state" json:"state"`
	Reason   string   `bson:"reason,omitempty" json:"reason,omitempty"`
	Machines []string `bson:"machines" json:"machines"`
	JobID    string   `bson:"jobId,omitempty" json:"jobId,omitempty"`
	// TFJobID is the terraformer run of the current build, recorded so a build recovered
	// after a restart re-attaches to it.
	TFJobID string `bson:"tfJobId,omitempty" json:"-"`
	// Resets is the audit trail of administrators' stack.reset (stack.describe shows it).
	Resets []StackReset `bson:"resets,omitempty" json:"-"`
	// Diverged: the stack's files are no longer its template revision's (stack.scale changed
	// them); stack.update to a revision replaces them with that revision's again.
	Diverged bool `bson:"diverged,omitempty" json:"diverged,omitempty"`
	// Pool is the pool (prebuilt stacks) the stack was built for; it stays after a user claimed
	// the stack (ClaimedAt set). An unclaimed pool stack is owned by PoolOwner.
	Pool      string    `bson:"pool,omitempty" json:"pool,omitempty"`
	ClaimedAt time.Time `bson:"claimedAt,omitempty" json:"claimedAt,omitzero"`
	// LatestRev and UpdateAvailable are computed by stack.describe and stack.list (never stored):
	// the template's latest revision, and whether it is newer than the stack's TemplateRev.
	LatestRev       int       `bson:"-" json:"latestRev,omitempty"`
	UpdateAvailable bool      `bson:"-" json:"updateAvailable,omitempty"`
	CreatedAt       time.Time `bson:"createdAt" json:"createdAt"`
	UpdatedAt       time.Time `bson:"updatedAt" json:"updatedAt"`
}

// PoolOwner owns a prebuilt stack, and its machines' accounts and agent keys, until a user
// claims it: a reserved username (api.ReservedUsernames) that is a valid machine account name and
// no user's. A claim hands the stack to the user (store.Stacks.Claim) and the machines to the
// user's agent keys and account (klient.adopt).
const PoolOwner = "kloud-pool"

// Pool is an administrator's order for prebuilt stacks: Size stacks of a template's latest
// revision (with a preset, when the template has parameters) kept built and owned by PoolOwner,
// for stack.create to claim.
type Pool struct {
	ID         string `bson:"_id" json:"id"` // the template's id, "/" and the preset's name when there is one
	Team       string `bson:"team" json:"team"`
	TemplateID string `bson:"templateId" json:"templateId"`
	Preset     string `bson:"preset,omitempty" json:"preset,omitempty"`
	Size       int    `bson:"size" json:"size"`
	// Schedule changes the size by the time of day and week (api.PoolSize): the first window
	// that holds the time gives it; outside every window Size holds. TimeZone (an IANA name,
	// "": UTC) is the windows' time zone.
	Schedule []PoolWindow `bson:"schedule,omitempty" json:"schedule,omitempty"`
	TimeZone string       `bson:"timeZone,omitempty" json:"timeZone,omitempty"`
	// Problem is what kept the reconciler's last pass from bringing the pool to its size (its
	// quota, a failed plan), "" when nothing did.
	Problem   string    `bson:"problem,omitempty" json:"problem,omitempty"`
	UpdatedBy string    `bson:"updatedBy" json:"updatedBy"`
	UpdatedAt time.Time `bson:"updatedAt" json:"updatedAt"`
}

// PoolWindow is a window of a pool's schedule: on Days ("daily", "weekdays", a day "mon", a range
// "mon-fri", a list "sat,sun"), from From to To ("HH:MM", 24-hour; To at or before From ends the next day),
// the pool's size is Size.
type PoolWindow struct {
	Days string `bson:"days" json:"days"`
	From string `bson:"from" json:"from"`
	To   string `bson:"to" json:"to"`
	Size int    `bson:"size" json:"size"`
}

// PoolID is the id of the pool of templateID's stacks with preset ("" for none).
func PoolID(templateID, preset string) string {
	if preset == "" {
		return templateID
	}
	return templateID + "/" + preset
}

// Agent connection states of a machine, shown apart from its infrastructure state.
const (
	AgentNever        = "never"
	AgentConnected    = "connected"
	AgentDisconnected = "disconnected"
)

// Agent is what kloud knows of a machine's klient.
type Agent struct {
	Status   string    `bson:"status" json:"status"`
	LastSeen time.Time `bson:"lastSeen,omitempty" json:"lastSeen,omitzero"`
	Version  string    `bson:"version,omitempty" json:"version,omitempty"`
	// Replica is the kloud replica (store instance id) that last saw the agent connect, so
	// that only it marks the agent disconnected (store.Machines.SetAgentOf). Not on the wire.
	Replica string `bson:"replica,omitempty" json:"-"`
}

// Share grants (issue: machine sharing).
const (
	GrantReadonly = "readonly"
	GrantTerminal = "terminal"
	GrantFull     = "full"
)

// Share is a user a machine is shared with.
type Share struct {
	Username string `bson:"username" json:"username"`
	Grant    string `bson:"grant" json:"grant"`
}

// Machine is one machine of a stack (collection machines).
type Machine struct {
	ID         string         `bson:"_id" json:"id"`
	StackID    string         `bson:"stackId" json:"stackId"`
	Label      string         `bson:"label" json:"label"`
	Resource   string         `bson:"resource" json:"resource"`
	Index      *int           `bson:"index,omitempty" json:"index,omitempty"`
	Provider   string         `bson:"provider" json:"provider"`
	Owner      string         `bson:"owner" json:"owner"`
	Team       string         `bson:"team" json:"team"`
	State      ptype.State    `bson:"state" json:"state"`
	Reason     string         `bson:"reason,omitempty" json:"reason,omitempty"`
	KiteID     string         `bson:"kiteId,omitempty" json:"kiteId,omitempty"`
	Agent      Agent          `bson:"agent" json:"agent"`
	IPAddress  string         `bson:"ipAddress,omitempty" json:"ipAddress,omitempty"`
	Attributes map[string]any `bson:"attributes,omitempty" json:"attributes,omitempty"`
	Meta       map[string]any `bson:"meta,omitempty" json:"meta,omitempty"`
	Shares     []Share        `bson:"shares,omitempty" json:"shares,omitempty"`
	// Ports are the firewall rules asked for with machine.ports.open/close (normalized): the
	// desired state. The provider enforces them; after a build or an update settles kloud
	// re-applies them to a machine the update replaced (kloud/ports.go).
	Ports []ptype.PortRule `bson:"ports,omitempty" json:"ports,omitempty"`
	// SSHHostKey is the machine's SSH host key as its klient last reported it to kloud (one
	// authorized_keys line; kloud/relay ssh.go): what `kloud config-ssh` pins, also while the
	// machine is stopped.
	SSHHostKey string `bson:"sshHostKey,omitempty" json:"sshHostKey,omitempty"`
	// AgentSealed is the machine's agent configuration (its kite key among it) as its user data
	// was rendered, sealed by the store (AAD "machines/<id>/agent"). stack.update renders a
	// machine that stays with it again, so its user data, and the machine, do not change.
	AgentSealed []byte `bson:"agentSealed,omitempty" json:"-"`
	// Handover is a claimed pool stack's machine on its way to its owner's agent key
	// (kloud/handover.go): the new key's kite id and its agent configuration, sealed as
	// AgentSealed; the kite id replaces KiteID once the agent registered with it.
	HandoverKiteID string `bson:"handoverKiteId,omitempty" json:"-"`
	HandoverSealed []byte `bson:"handoverSealed,omitempty" json:"-"`
	// Idle is the machine's idle stop: its own settings (machine.set) and the countdown
	// (kloud/idle.go).
	Idle Idle `bson:"idle,omitempty" json:"idle,omitzero"`
	// Autostart starts the machine on a schedule (machine.set autostart; kloud/idle.go).
	Autostart *Autostart `bson:"autostart,omitempty" json:"autostart,omitempty"`
	CreatedAt time.Time  `bson:"createdAt" json:"createdAt"`
	UpdatedAt time.Time  `bson:"updatedAt" json:"updatedAt"`
}

// IdleSettings say when kloud stops a machine nobody uses (kloud/idle.go). A nil field inherits:
// a machine's from its stack's template, a template's from kloud (kloud serve --idle-timeout).
type IdleSettings struct {
	// TimeoutSeconds is how long a Running machine may go without activity before kloud stops
	// it; 0: never.
	TimeoutSeconds *int64 `bson:"timeoutSec,omitempty" json:"timeoutSeconds,omitempty"`
	// AlwaysOn machines are never stopped for being idle.
	AlwaysOn *bool `bson:"alwaysOn,omitempty" json:"alwaysOn,omitempty"`
}

// Idle is a machine's idle stop: its settings and its countdown. The countdown is in the store,
// so a kloud restart neither loses nor resets it.
type Idle struct {
	IdleSettings `bson:",inline"`
	// LastActivity is the last activity kloud recorded (throttled), or when the countdown
	// started (the machine started, or got a timeout).
	LastActivity time.Time `bson:"lastActivity,omitempty" json:"lastActivity,omitzero"`
	// Deadline is when kloud stops the machine unless there is activity before (zero: no
	// countdown: not Running, always on, or no timeout).
	Deadline time.Time `bson:"deadline,omitempty" json:"deadline,omitzero"`
	// EffectiveTimeoutSeconds and EffectiveAlwaysOn are the settings in force, the machine's
	// own or inherited; machine.list and machine.info compute them (never stored).
	EffectiveTimeoutSeconds int64 `bson:"-" json:"effectiveTimeoutSeconds,omitempty"`
	EffectiveAlwaysOn       bool  `bson:"-" json:"effectiveAlwaysOn,omitempty"`
}

// Autostart is a machine's start schedule: kloud starts it, if it is Stopped, at Time on Days
// in time zone TZ (kloud/idle.go).
type Autostart struct {
	// Schedule is as machine.set took it: "mon-fri 09:00", "daily 08:30", "sat,sun 10:00".
	Schedule string `bson:"schedule" json:"schedule"`
	TZ       string `bson:"tz" json:"tz"` // an IANA time zone; default UTC
	// Next is the next start kloud will make (kept in the store: a restart keeps it).
	Next time.Time `bson:"next" json:"next"`
}
