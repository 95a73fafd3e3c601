package api

import "github.com/kloud-dev/kloud/kloud/model"

// The documents kloud keeps (package model) are also what its methods carry; they are named
// here so a client needs only this package.
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
	Snapshot         = model.Snapshot // snapshots.go
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
