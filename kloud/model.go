package kloud

import (
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
)

// Documents kloud keeps in the store, one Go type per collection; they are the documents of the
// wire contract too, defined in package api (model.go there), named here for kloud's own code.
type (
	User             = api.User
	Team             = api.Team
	Member           = api.Member
	File             = api.File
	Credential       = api.Credential
	Bootstrap        = api.Bootstrap
	Template         = api.Template
	TemplateRevision = api.TemplateRevision
	Stack            = api.Stack
	Agent            = api.Agent
	Share            = api.Share
	Machine          = api.Machine
	StackReset       = api.StackReset
	TemplateTrust    = api.TemplateTrust
	Autostart        = api.Autostart // idle.go
)

// Team roles.
const (
	RoleAdmin  = api.RoleAdmin
	RoleMember = api.RoleMember
)

// Kloud-wide roles of users (User.Role; roles.go).
const (
	RoleOwner         = model.RoleOwner
	RoleTemplateAdmin = model.RoleTemplateAdmin
	RoleAuditor       = model.RoleAuditor
	RoleUser          = model.RoleUser
)

// DefaultTeam is created at first start with the admin in it.
const DefaultTeam = api.DefaultTeam

// Stack states (Koding's stackstate).
const (
	StackNotInitialized = api.StackNotInitialized
	StackBuilding       = api.StackBuilding
	StackInitialized    = api.StackInitialized
	StackDestroying     = api.StackDestroying
	StackFailed         = api.StackFailed
)

// Agent connection states of a machine, shown apart from its infrastructure state.
const (
	AgentNever        = api.AgentNever
	AgentConnected    = api.AgentConnected
	AgentDisconnected = api.AgentDisconnected
)

// Share grants.
const (
	GrantReadonly = api.GrantReadonly
	GrantTerminal = api.GrantTerminal
	GrantFull     = api.GrantFull
)
