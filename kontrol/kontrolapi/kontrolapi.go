// Package kontrolapi holds the wire types of kontrol's methods (docs/protocol.md §kontrol):
// method names, params and results, and the kontrol.event notification. Kites that call kontrol
// (klient, the CLI) import this package, not kontrol, which is the registry itself.
//
// Start with the method-name constants; each params or result type names its method.
package kontrolapi

import (
	"errors"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
)

// Method names.
const (
	MethodRegister  = "kontrol.register"
	MethodGetKey    = "kontrol.getKey"
	MethodQuery     = "kontrol.query"
	MethodGetToken  = "kontrol.getToken"
	MethodCreateKey = "kontrol.createKey"
	MethodRotateKey = "kontrol.rotateKey"
	MethodRetireKey = "kontrol.retireKey"
	MethodRevoke    = "kontrol.revoke"
	// MethodEvent is the notification of a kontrol.query watch (params: Event).
	MethodEvent = "kontrol.event"
)

// HostNames are the kite names of host kites: klients on a user's own host that build machines
// for that user (VagrantHostName: klient --vagrant). kontrol lets only a kite key register under
// them, never a machine's agent key, so kloud can trust a kite of that name and owner to be the
// owner's host.
var HostNames = []string{VagrantHostName}

// VagrantHostName is the kite name of a vagrant host (klient --vagrant).
const VagrantHostName = "klient-vagrant"

// KiteInfo describes a registered kite.
type KiteInfo struct {
	Kite         kite.Identity `json:"kite"`
	URL          string        `json:"url,omitempty"`
	RegisteredAt time.Time     `json:"registeredAt"`
	Remote       string        `json:"remote,omitempty"`
}

// RegisterParams are the params of kontrol.register.
type RegisterParams struct {
	// URL where the kite also accepts connections, if it listens (optional: kites are reached
	// through their registration connection).
	URL string `json:"url,omitempty"`
}

// RegisterResult is the result of kontrol.register.
type RegisterResult struct {
	Kite KiteInfo `json:"kite"`
	// Keys are kontrol's public keys, so the kite can verify tokens presented to it.
	Keys []kitekey.PublicKey `json:"keys"`
}

// QueryParams are the params of kontrol.query. Every non-empty field of Query must match.
type QueryParams struct {
	Query kite.Identity `json:"query"`
	// Watch keeps a stream open: kontrol.event notifications when a matching kite registers or
	// goes away.
	Watch bool `json:"watch,omitempty"`
}

// Validate implements kite.Validator.
func (p *QueryParams) Validate() error { return p.Query.Validate(false) }

// QueryResult is the result of kontrol.query.
type QueryResult struct {
	Kites        []KiteInfo `json:"kites"`
	Subscription string     `json:"subscription,omitempty"`
}

// GetTokenParams are the params of kontrol.getToken.
type GetTokenParams struct {
	Query kite.Identity `json:"query"`
}

// Validate implements kite.Validator.
func (p *GetTokenParams) Validate() error {
	if p.Query == (kite.Identity{}) {
		return errors.New("query is empty")
	}
	return p.Query.Validate(false)
}

// GetTokenResult is the result of kontrol.getToken.
type GetTokenResult struct {
	Token     string    `json:"token"`
	Kite      KiteInfo  `json:"kite"`
	ExpiresAt time.Time `json:"expiresAt"`
}

// KeysResult is the result of kontrol.getKey.
type KeysResult struct {
	Current string              `json:"current"`
	Keys    []kitekey.PublicKey `json:"keys"`
}

// CreateKeyParams are the params of kontrol.createKey.
type CreateKeyParams struct {
	Username string `json:"username"`
	KiteID   string `json:"kiteId,omitempty"` // default: a new random id
}

// Validate implements kite.Validator.
func (p *CreateKeyParams) Validate() error {
	if p.Username == "" {
		return errors.New("username is required")
	}
	return nil
}

// CreateKeyResult is the result of kontrol.createKey.
type CreateKeyResult struct {
	Key    string `json:"key"`
	KiteID string `json:"kiteId"`
}

// RetireKeyParams are the params of kontrol.retireKey.
type RetireKeyParams struct {
	KID string `json:"kid"`
}

// RevokeParams are the params of kontrol.revoke.
type RevokeParams struct {
	JTI    string `json:"jti"`
	Reason string `json:"reason,omitempty"`
}

// Validate implements kite.Validator.
func (p *RevokeParams) Validate() error {
	if p.JTI == "" {
		return errors.New("jti is required")
	}
	return nil
}

// Event is a watch notification (method kontrol.event).
type Event struct {
	Action string   `json:"action"` // "register" or "deregister"
	Kite   KiteInfo `json:"kite"`
}
