package kitekey

import (
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Kinds: the "kind" claim every JWT of ours carries, so that one kind can never stand in for
// another (a kite key is not a token, a token is not a session).
const (
	KindKiteKey  = "kiteKey"
	KindAgentKey = "agentKey"
	KindToken    = "token"
	KindSession  = "session"
	// KindPluginKey is the key of an out-of-process provider (provider/plugin): it proves
	// "the plugin serving provider NAME" and nothing else.
	KindPluginKey = "pluginKey"
)

// Agent keys (the /etc/kloud/kite.key of a machine) name the machine, never a user.
const (
	// AgentIDPrefix starts the kite id (jti) of every machine agent's key. Kloud has minted
	// machine keys with it since the first version, so a kite key (kind kiteKey) whose jti has
	// it is an agent's key from before agent keys had their own kind (a "legacy agent key"):
	// Authenticator treats it as an agent key, never as its owner.
	AgentIDPrefix = "agent."
	// MachineSubjectPrefix starts the sub of an agent key: "machine:<machine id>". Usernames
	// never contain ':' (kloud's are [a-z][a-z0-9-]*), so it cannot name a user.
	MachineSubjectPrefix = "machine:"
)

// Plugin keys (the key an out-of-process provider dials kloud with) name the provider, never a
// user.
const (
	// PluginIDPrefix starts the jti (kite id) of every plugin key.
	PluginIDPrefix = "plugin."
	// PluginSubjectPrefix starts the sub of a plugin key: "provider:<name>". Like
	// MachineSubjectPrefix, it cannot name a user.
	PluginSubjectPrefix = "provider:"
)

// PluginSubject is the sub of the plugin key of the provider called name.
func PluginSubject(name string) string { return PluginSubjectPrefix + name }

// MachineSubject is the sub of the agent key of the machine with id machineID.
func MachineSubject(machineID string) string { return MachineSubjectPrefix + machineID }

// Lifetime limits, enforced when signing and when verifying (plus leeway).
const (
	MaxTokenTTL   = time.Hour           // exp - iat of a token
	MaxSessionTTL = 30 * 24 * time.Hour // exp - iat of a session
)

// KiteKeyClaims are the claims of a kite key (the kite.key file): iss = kontrol, sub = the owner,
// jti = the kite id, iat. No exp: a kite key is valid until its jti is revoked or its signing key
// is retired.
type KiteKeyClaims struct {
	jwt.RegisteredClaims
	Kind       string `json:"kind"`
	KontrolURL string `json:"kontrolURL"`
}

// AgentKeyClaims are the claims of a machine agent's key (kind agentKey): iss = kontrol, sub =
// "machine:<machine id>", jti = the agent's kite id (AgentIDPrefix + random), iat, and what the
// agent needs to know about itself: the machine's owner, machine and stack ids and the kontrol
// URL. No exp (revocable by jti, like a kite key). An agent key proves "the agent of machine M,
// owned by O" and nothing else: it is accepted only for the agent-facing calls (registering that
// one kite), never as the owner.
type AgentKeyClaims struct {
	jwt.RegisteredClaims
	Kind       string `json:"kind"`
	KontrolURL string `json:"kontrolURL"`
	Owner      string `json:"owner"`
	MachineID  string `json:"machineId"`
	StackID    string `json:"stackId,omitempty"`
}

// PluginKeyClaims are the claims of a plugin key (kind pluginKey): iss = kontrol, sub =
// PluginSubject(provider), jti = PluginIDPrefix + random, iat, and optionally exp (kloud gives
// the plugins it launches keys that expire; keys for remote plugins do not, and are revocable by
// jti like kite keys). A plugin key proves "the plugin serving provider P" and is accepted only
// by servers that set Authenticator.Plugins, for the methods routed with Gate(h, KindPluginKey).
type PluginKeyClaims struct {
	jwt.RegisteredClaims
	Kind     string `json:"kind"`
	Provider string `json:"provider"`
}

// TokenClaims are the claims of a token: sub = the caller, aud = exactly one kite id, iat, nbf,
// exp at most MaxTokenTTL after iat, random jti. There is no audience that matches every kite.
type TokenClaims struct {
	jwt.RegisteredClaims
	Kind string `json:"kind"`
}

// SessionClaims are the claims of a logged-in user's session: sub = the user, iat, nbf, exp,
// random jti, and Admin if the user was an administrator when the session was issued.
type SessionClaims struct {
	jwt.RegisteredClaims
	Kind  string `json:"kind"`
	Admin bool   `json:"admin,omitempty"`
}

// claims is what the verifier needs from each claims type.
type claims interface {
	jwt.Claims
	kind() string
	registered() *jwt.RegisteredClaims
}

func (c *KiteKeyClaims) kind() string                        { return c.Kind }
func (c *KiteKeyClaims) registered() *jwt.RegisteredClaims   { return &c.RegisteredClaims }
func (c *AgentKeyClaims) kind() string                       { return c.Kind }
func (c *AgentKeyClaims) registered() *jwt.RegisteredClaims  { return &c.RegisteredClaims }
func (c *PluginKeyClaims) kind() string                      { return c.Kind }
func (c *PluginKeyClaims) registered() *jwt.RegisteredClaims { return &c.RegisteredClaims }
func (c *TokenClaims) kind() string                          { return c.Kind }
func (c *TokenClaims) registered() *jwt.RegisteredClaims     { return &c.RegisteredClaims }
func (c *SessionClaims) kind() string                        { return c.Kind }
func (c *SessionClaims) registered() *jwt.RegisteredClaims   { return &c.RegisteredClaims }
