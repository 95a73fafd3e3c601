package kitekey

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/golang-jwt/jwt/v5"

	"github.com/kloud-dev/kloud/kite"
)

// Authenticator is the kite.Authenticator for the JWT auth types:
//
//   - kite.AuthKiteKey: a kite key; Principal{Username: sub, KiteID: jti, TokenID: jti}.
//   - kite.AuthToken: a token whose aud must be exactly the id of the kite being dialed (self.ID).
//   - kite.AuthSession: a session; Principal.Admin is claims.Admin || IsAdmin(sub).
//
// A machine agent's key — kind agentKey, or a kite key whose jti starts with AgentIDPrefix (an
// agent's key minted before agent keys had their own kind) — is accepted only if Agents is set,
// whichever auth type it is presented as (its signed kind decides, not the claimed type). It
// authenticates as Principal{Type: KindAgentKey, Username: the machine's owner, KiteID: jti,
// TokenID: jti}: the owner's name is there so that the agent registers under it, and Type says it
// is an agent, which every server refuses for all but its agent-facing methods (AgentGate).
//
// An out-of-process provider's key (kind pluginKey) is accepted only if Plugins is set, whichever
// auth type it is presented as. It authenticates as Principal{Type: KindPluginKey, Username:
// PluginSubject(provider), KiteID: jti, TokenID: jti, Expires: exp}: a name no user can have,
// and a Type every server refuses for all but its plugin-facing methods (Gate).
//
// Any other type is rejected with an error wrapping kite.ErrAuth.
type Authenticator struct {
	Verifier *Verifier
	IsAdmin  func(username string) bool // optional; consulted for sessions
	// Agents accepts machine agents' keys (kontrol, and kloud which hosts it). Off: agent keys
	// are rejected at the handshake (klient, terraformer: no agent ever needs to dial them).
	Agents bool
	// Plugins accepts out-of-process providers' keys (kloud). Off: plugin keys are rejected at
	// the handshake.
	Plugins bool
	// Replicas accepts other kloud replicas' keys (replicakey.go; kloud). Off: replica keys are
	// rejected at the handshake.
	Replicas bool
}

var _ kite.Authenticator = (*Authenticator)(nil)

// Authenticate verifies a as presented to the kite self.
func (a *Authenticator) Authenticate(ctx context.Context, self kite.Identity, au kite.Auth) (*kite.Principal, error) {
	if a == nil || a.Verifier == nil {
		return nil, fmt.Errorf("authenticate %s: no verifier configured", au.Type)
	}
	switch au.Type {
	case kite.AuthKiteKey:
		c, err := a.Verifier.KiteKey(ctx, au.Key)
		if p, ok, err := a.otherKind(ctx, au.Key, err); ok {
			return p, err
		}
		if err != nil {
			return nil, err
		}
		if strings.HasPrefix(c.ID, AgentIDPrefix) {
			if !a.Agents {
				return nil, refuseAgent(c.ID)
			}
			return &kite.Principal{Username: c.Subject, Type: KindAgentKey, KiteID: c.ID, TokenID: c.ID}, nil
		}
		p := &kite.Principal{Username: c.Subject, Type: au.Type, KiteID: c.ID, TokenID: c.ID}
		if c.ExpiresAt != nil {
			p.Expires = c.ExpiresAt.Time
		}
		return p, nil
	case KindAgentKey:
		return a.agent(ctx, au.Key)
	case KindPluginKey:
		return a.plugin(ctx, au.Key)
	case KindReplicaKey:
		return a.replica(ctx, au.Key)
	case kite.AuthToken:
		if self.ID == "" {
			return nil, fmt.Errorf("token: %w: this kite has no id to match aud against", ErrWrongAudience)
		}
		c, err := a.Verifier.Token(ctx, au.Key, self.ID)
		if err != nil {
			return nil, err
		}
		return &kite.Principal{Username: c.Subject, Type: au.Type, TokenID: c.ID, Expires: c.ExpiresAt.Time}, nil
	case kite.AuthSession:
		c, err := a.Verifier.Session(ctx, au.Key)
		if p, ok, err := a.otherKind(ctx, au.Key, err); ok {
			return p, err
		}
		if err != nil {
			return nil, err
		}
		admin := c.Admin || (a.IsAdmin != nil && a.IsAdmin(c.Subject))
		return &kite.Principal{Username: c.Subject, Type: au.Type, TokenID: c.ID, Expires: c.ExpiresAt.Time, Admin: admin}, nil
	}
	return nil, fmt.Errorf("auth type %q: %w: want %q, %q or %q", short(au.Type), kite.ErrAuth,
		kite.AuthKiteKey, kite.AuthToken, kite.AuthSession)
}

// otherKind handles an agent or plugin key presented as a kite key or a session: the key's signed
// kind decides, not the claimed type. ok is false if raw is neither.
func (a *Authenticator) otherKind(ctx context.Context, raw string, err error) (*kite.Principal, bool, error) {
	if !errors.Is(err, ErrWrongKind) {
		return nil, false, nil
	}
	switch unverifiedKind(raw) {
	case KindAgentKey:
		p, err := a.agent(ctx, raw)
		return p, true, err
	case KindPluginKey:
		p, err := a.plugin(ctx, raw)
		return p, true, err
	case KindReplicaKey:
		p, err := a.replica(ctx, raw)
		return p, true, err
	}
	return nil, false, nil
}

func (a *Authenticator) plugin(ctx context.Context, raw string) (*kite.Principal, error) {
	c, err := a.Verifier.PluginKey(ctx, raw)
	if err != nil {
		return nil, err
	}
	if !a.Plugins {
		return nil, fmt.Errorf("plugin key of provider %q: %w: provider plugins' keys are accepted only by kloud", short(c.Provider), ErrWrongKind)
	}
	p := &kite.Principal{Username: c.Subject, Type: KindPluginKey, KiteID: c.ID, TokenID: c.ID}
	if c.ExpiresAt != nil {
		p.Expires = c.ExpiresAt.Time
	}
	return p, nil
}

func (a *Authenticator) agent(ctx context.Context, raw string) (*kite.Principal, error) {
	c, err := a.Verifier.AgentKey(ctx, raw)
	if err != nil {
		return nil, err
	}
	if !a.Agents {
		return nil, refuseAgent(c.ID)
	}
	return &kite.Principal{Username: c.Owner, Type: KindAgentKey, KiteID: c.ID, TokenID: c.ID}, nil
}

func refuseAgent(id string) error {
	return fmt.Errorf("agent key of kite %q: %w: machine agents' keys are accepted only by kontrol, to register their own agent", short(id), ErrWrongKind)
}

// unverifiedKind reads the kind claim without checking anything (only to pick which verifier
// to run; the verifier then checks everything).
func unverifiedKind(raw string) string {
	var c struct {
		jwt.RegisteredClaims
		Kind string `json:"kind"`
	}
	if _, _, err := jwt.NewParser().ParseUnverified(raw, &c); err != nil {
		return ""
	}
	return c.Kind
}

// IsAgent reports whether p is a machine agent (authenticated with an agent key, or with a kite
// key minted for an agent before agent keys had their own kind).
func IsAgent(p *kite.Principal) bool { return p != nil && p.Type == KindAgentKey }

// IsPlugin reports whether p is an out-of-process provider (authenticated with a plugin key).
func IsPlugin(p *kite.Principal) bool {
	return p != nil && p.Type == KindPluginKey && strings.HasPrefix(p.Username, PluginSubjectPrefix)
}

// PluginName is the provider name a plugin principal proved ("" if p is not a plugin).
func PluginName(p *kite.Principal) string {
	if !IsPlugin(p) {
		return ""
	}
	return strings.TrimPrefix(p.Username, PluginSubjectPrefix)
}

// IsRestricted reports whether p is a restricted principal: a machine agent, a plugin or another
// kloud replica. Such a principal acts for no user and may call only the methods routed for its
// kind (Gate).
func IsRestricted(p *kite.Principal) bool {
	return p != nil && (p.Type == KindAgentKey || p.Type == KindPluginKey || p.Type == KindReplicaKey)
}

// AgentRefused is the error every method that is not agent-facing returns to a machine agent:
// -32002, saying what agent keys are for.
func AgentRefused(r *kite.Request) error {
	id := ""
	if p := r.Principal(); p != nil {
		id = p.KiteID
	}
	return fmt.Errorf("%s: agent keys may only register their own agent (this is the key of agent %s): %w", r.Method, short(id), kite.ErrPermission)
}

// PluginRefused is the error every method that is not plugin-facing returns to a provider
// plugin: -32002, saying what plugin keys are for.
func PluginRefused(r *kite.Request) error {
	return fmt.Errorf("%s: plugin keys may only call the plugin-facing methods (this is the key of provider %s): %w",
		r.Method, short(PluginName(r.Principal())), kite.ErrPermission)
}

// Gate wraps h so that restricted principals (machine agents, provider plugins) are refused with
// -32002 unless their Type is in allow; users are never affected. Every server registers each of
// its methods through it with the kinds from its method table, so a method nobody opened to a
// kind refuses it (default deny): Gate(h) is for users only, Gate(h, KindAgentKey) also serves
// agents, Gate(h, KindPluginKey) also serves plugins.
func Gate(h kite.Handler, allow ...string) kite.Handler {
	return kite.HandlerFunc(func(ctx context.Context, r *kite.Request) (any, error) {
		p := r.Principal()
		if IsRestricted(p) && !slices.Contains(allow, p.Type) {
			switch p.Type {
			case KindPluginKey:
				return nil, PluginRefused(r)
			case KindReplicaKey:
				return nil, ReplicaRefused(r)
			}
			return nil, AgentRefused(r)
		}
		return h.ServeKite(ctx, r)
	})
}

// RefuseAgents is Gate(h): for kite.Options.GateBuiltins of a server that accepts agent or
// plugin keys, so that kite's own built-ins refuse them like every method not opened to them.
func RefuseAgents(h kite.Handler) kite.Handler { return Gate(h) }

// AgentGate is Gate(h, KindAgentKey) if agentCallable, else Gate(h): the form kontrol's and
// kloud's method tables used before plugins. Plugins are refused either way.
func AgentGate(h kite.Handler, agentCallable bool) kite.Handler {
	if agentCallable {
		return Gate(h, KindAgentKey)
	}
	return Gate(h)
}
