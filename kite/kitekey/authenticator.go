package kitekey

import (
	"context"
	"errors"
	"fmt"
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
// Any other type is rejected with an error wrapping kite.ErrAuth.
type Authenticator struct {
	Verifier *Verifier
	IsAdmin  func(username string) bool // optional; consulted for sessions
	// Agents accepts machine agents' keys (kontrol, and kloud which hosts it). Off: agent keys
	// are rejected at the handshake (klient, terraformer: no agent ever needs to dial them).
	Agents bool
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
		if errors.Is(err, ErrWrongKind) && unverifiedKind(au.Key) == KindAgentKey {
			return a.agent(ctx, au.Key)
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
		if errors.Is(err, ErrWrongKind) && unverifiedKind(au.Key) == KindAgentKey {
			return a.agent(ctx, au.Key)
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

// AgentRefused is the error every method that is not agent-facing returns to a machine agent:
// -32002, saying what agent keys are for.
func AgentRefused(r *kite.Request) error {
	id := ""
	if p := r.Principal(); p != nil {
		id = p.KiteID
	}
	return fmt.Errorf("%s: agent keys may only register their own agent (this is the key of agent %s): %w", r.Method, short(id), kite.ErrPermission)
}

// RefuseAgents is AgentGate(h, false): for kite.Options.GateBuiltins of a server that accepts
// agent keys, so that kite's own built-ins refuse agents like every method not agent-facing.
func RefuseAgents(h kite.Handler) kite.Handler { return AgentGate(h, false) }

// AgentGate wraps h so that machine agents are refused (AgentRefused) unless agentCallable. Every
// server registers each of its methods through it with the flag from its method table, so a
// method nobody marked agent-callable refuses agents (default deny).
func AgentGate(h kite.Handler, agentCallable bool) kite.Handler {
	if agentCallable {
		return h
	}
	return kite.HandlerFunc(func(ctx context.Context, r *kite.Request) (any, error) {
		if IsAgent(r.Principal()) {
			return nil, AgentRefused(r)
		}
		return h.ServeKite(ctx, r)
	})
}
