package store

import "github.com/kloud-dev/kloud/kloud/model"

// The documents the repositories (repos.go) read and write are defined in package model,
// shared with the wire contract (kloud/api); they are named here for this package's callers.
type (
	User             = model.User
	Team             = model.Team
	Member           = model.Member
	File             = model.File
	Credential       = model.Credential
	Bootstrap        = model.Bootstrap
	Template         = model.Template
	TemplateRevision = model.TemplateRevision
	TemplateTrust    = model.TemplateTrust
	Stack            = model.Stack
	StackReset       = model.StackReset
	Agent            = model.Agent
	Share            = model.Share
	Machine          = model.Machine
	Snapshot         = model.Snapshot     // snapshots.go
	IdleSettings     = model.IdleSettings // idle.go
	Idle             = model.Idle
	Autostart        = model.Autostart
)

// Team roles.
const (
	RoleAdmin  = model.RoleAdmin
	RoleMember = model.RoleMember
)

// DefaultTeam is created at first start with the admin in it.
const DefaultTeam = model.DefaultTeam

// Stack states (Koding's stackstate).
const (
	StackNotInitialized = model.StackNotInitialized
	StackBuilding       = model.StackBuilding
	StackInitialized    = model.StackInitialized
	StackDestroying     = model.StackDestroying
	StackFailed         = model.StackFailed
)

// Agent connection states of a machine, shown apart from its infrastructure state.
const (
	AgentNever        = model.AgentNever
	AgentConnected    = model.AgentConnected
	AgentDisconnected = model.AgentDisconnected
)

// Share grants (machine sharing).
const (
	GrantReadonly = model.GrantReadonly
	GrantTerminal = model.GrantTerminal
	GrantFull     = model.GrantFull
)

// Bootstrap statuses (Credential.Bootstrap.Status).
const (
	BootstrapNone       = model.BootstrapNone
	BootstrapRunning    = model.BootstrapRunning
	BootstrapDone       = model.BootstrapDone
	BootstrapFailed     = model.BootstrapFailed
	BootstrapDestroying = model.BootstrapDestroying
	BootstrapDestroyed  = model.BootstrapDestroyed
)
