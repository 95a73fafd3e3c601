package kitekey

import (
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/kloud-dev/kloud/kite"
)

// Signer mints kite keys, agent keys, tokens and sessions. Only kontrol (and kloud, which hosts it) holds
// one. Input errors wrap kite.ErrInvalidParams.
type Signer struct {
	// Key signs. Ignored if Current is set.
	Key *KeyPair
	// Current, if set, is called for every signature and returns the key to sign with; pass a
	// Keyring's Current method so that signing follows rotation.
	Current func() *KeyPair
	// Issuer is the iss claim (kontrol's name); verifiers must be configured with the same.
	Issuer string
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// KiteKey mints a kite key for the kite kiteID owned by username. It does not expire. Machine
// agents get AgentKey instead; a kite key whose kiteID starts with AgentIDPrefix is taken for
// an agent's (legacy) key by Authenticator.
func (s *Signer) KiteKey(username, kiteID, kontrolURL string) (string, error) {
	if err := checkName("username", username); err != nil {
		return "", fmt.Errorf("sign kite key: %w", err)
	}
	if err := checkName("kite id", kiteID); err != nil {
		return "", fmt.Errorf("sign kite key: %w", err)
	}
	if kontrolURL == "" {
		return "", fmt.Errorf("sign kite key: empty kontrol URL: %w", kite.ErrInvalidParams)
	}
	now := s.now()
	return s.sign("sign kite key", &KiteKeyClaims{
		RegisteredClaims: jwt.RegisteredClaims{
			Issuer:   s.Issuer,
			Subject:  username,
			ID:       kiteID,
			IssuedAt: jwt.NewNumericDate(now),
		},
		Kind:       KindKiteKey,
		KontrolURL: kontrolURL,
	})
}

// AgentKeySpec describes the machine agent an agent key is minted for.
type AgentKeySpec struct {
	Owner      string // the machine's owner (a username); required
	MachineID  string // required; the key's sub is MachineSubject(MachineID)
	StackID    string // optional
	KiteID     string // the agent's kite id (jti); required, must start with AgentIDPrefix
	KontrolURL string // required
}

// AgentKey mints the key of a machine's agent (kind agentKey). It does not expire.
func (s *Signer) AgentKey(a AgentKeySpec) (string, error) {
	if err := a.check(); err != nil {
		return "", fmt.Errorf("sign agent key: %w", err)
	}
	now := s.now()
	return s.sign("sign agent key", &AgentKeyClaims{
		RegisteredClaims: jwt.RegisteredClaims{
			Issuer:   s.Issuer,
			Subject:  MachineSubject(a.MachineID),
			ID:       a.KiteID,
			IssuedAt: jwt.NewNumericDate(now),
		},
		Kind:       KindAgentKey,
		KontrolURL: a.KontrolURL,
		Owner:      a.Owner,
		MachineID:  a.MachineID,
		StackID:    a.StackID,
	})
}

func (a AgentKeySpec) check() error {
	for _, f := range []struct{ what, v string }{{"owner", a.Owner}, {"machine id", a.MachineID}, {"kite id", a.KiteID}} {
		if err := checkName(f.what, f.v); err != nil {
			return err
		}
	}
	switch {
	case strings.Contains(a.Owner, ":"):
		return fmt.Errorf("owner %q contains ':': %w", a.Owner, kite.ErrInvalidParams)
	case !strings.HasPrefix(a.KiteID, AgentIDPrefix):
		return fmt.Errorf("agent kite id %q must start with %q: %w", a.KiteID, AgentIDPrefix, kite.ErrInvalidParams)
	case strings.Contains(a.StackID, "/") || len(a.StackID) > 256:
		return fmt.Errorf("stack id %q: %w", a.StackID, kite.ErrInvalidParams)
	case a.KontrolURL == "":
		return fmt.Errorf("empty kontrol URL: %w", kite.ErrInvalidParams)
	}
	return nil
}

// PluginKeySpec describes the out-of-process provider a plugin key is minted for.
type PluginKeySpec struct {
	Provider string        // the provider's name; required (ValidProviderName)
	KiteID   string        // the jti; default PluginIDPrefix + random; must start with PluginIDPrefix
	TTL      time.Duration // 0: the key does not expire (remote plugins; revocable by jti)
}

// PluginKey mints the key of an out-of-process provider (kind pluginKey).
func (s *Signer) PluginKey(p PluginKeySpec) (string, error) {
	if err := ValidProviderName(p.Provider); err != nil {
		return "", fmt.Errorf("sign plugin key: %w", err)
	}
	if p.KiteID == "" {
		p.KiteID = PluginIDPrefix + strings.ToLower(rand.Text())
	}
	if err := checkName("kite id", p.KiteID); err != nil {
		return "", fmt.Errorf("sign plugin key: %w", err)
	}
	switch {
	case !strings.HasPrefix(p.KiteID, PluginIDPrefix):
		return "", fmt.Errorf("sign plugin key: kite id %q must start with %q: %w", p.KiteID, PluginIDPrefix, kite.ErrInvalidParams)
	case p.TTL < 0:
		return "", fmt.Errorf("sign plugin key: negative ttl %s: %w", p.TTL, kite.ErrInvalidParams)
	}
	now := s.now()
	c := &PluginKeyClaims{
		RegisteredClaims: jwt.RegisteredClaims{
			Issuer:   s.Issuer,
			Subject:  PluginSubject(p.Provider),
			ID:       p.KiteID,
			IssuedAt: jwt.NewNumericDate(now),
		},
		Kind:     KindPluginKey,
		Provider: p.Provider,
	}
	if p.TTL > 0 {
		c.ExpiresAt = jwt.NewNumericDate(now.Add(p.TTL))
	}
	return s.sign("sign plugin key", c)
}

// ValidProviderName checks a provider's name as plugin keys and plugins carry it: a lower-case
// letter, then lower-case letters, digits and '-', at most 63 bytes (so "provider:NAME" is never
// a username and kloud-provider-NAME is a file name). Errors wrap kite.ErrInvalidParams.
func ValidProviderName(name string) error {
	ok := name != "" && len(name) <= 63 && name[0] >= 'a' && name[0] <= 'z'
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
			ok = false
		}
	}
	if !ok {
		return fmt.Errorf("provider name %q: want a lower-case letter, then lower-case letters, digits and '-', at most 63: %w", short(name), kite.ErrInvalidParams)
	}
	return nil
}

// Token mints a token that lets username call the kite audienceKiteID for ttl (at most
// MaxTokenTTL).
func (s *Signer) Token(username, audienceKiteID string, ttl time.Duration) (string, error) {
	if err := checkName("username", username); err != nil {
		return "", fmt.Errorf("sign token: %w", err)
	}
	if err := checkName("audience kite id", audienceKiteID); err != nil {
		return "", fmt.Errorf("sign token: %w", err)
	}
	if ttl <= 0 || ttl > MaxTokenTTL {
		return "", fmt.Errorf("sign token: ttl %s not in (0, %s]: %w", ttl, MaxTokenTTL, kite.ErrInvalidParams)
	}
	now := s.now()
	return s.sign("sign token", &TokenClaims{
		RegisteredClaims: jwt.RegisteredClaims{
			Issuer:    s.Issuer,
			Subject:   username,
			Audience:  jwt.ClaimStrings{audienceKiteID},
			IssuedAt:  jwt.NewNumericDate(now),
			NotBefore: jwt.NewNumericDate(now),
			ExpiresAt: jwt.NewNumericDate(now.Add(ttl)),
			ID:        rand.Text(),
		},
		Kind: KindToken,
	})
}

// Session mints a session for username valid for ttl (at most MaxSessionTTL).
func (s *Signer) Session(username string, admin bool, ttl time.Duration) (string, error) {
	if err := checkName("username", username); err != nil {
		return "", fmt.Errorf("sign session: %w", err)
	}
	if ttl <= 0 || ttl > MaxSessionTTL {
		return "", fmt.Errorf("sign session: ttl %s not in (0, %s]: %w", ttl, MaxSessionTTL, kite.ErrInvalidParams)
	}
	now := s.now()
	return s.sign("sign session", &SessionClaims{
		RegisteredClaims: jwt.RegisteredClaims{
			Issuer:    s.Issuer,
			Subject:   username,
			IssuedAt:  jwt.NewNumericDate(now),
			NotBefore: jwt.NewNumericDate(now),
			ExpiresAt: jwt.NewNumericDate(now.Add(ttl)),
			ID:        rand.Text(),
		},
		Kind:  KindSession,
		Admin: admin,
	})
}

func (s *Signer) sign(op string, c jwt.Claims) (string, error) {
	key := s.Key
	if s.Current != nil {
		key = s.Current()
	}
	switch {
	case key == nil || len(key.Private) != ed25519.PrivateKeySize || key.ID == "":
		return "", fmt.Errorf("%s: signer has no usable key", op)
	case key.Retired():
		return "", fmt.Errorf("%s: signing key %q is retired", op, key.ID)
	case s.Issuer == "":
		return "", fmt.Errorf("%s: signer has no issuer", op)
	}
	t := jwt.NewWithClaims(jwt.SigningMethodEdDSA, c)
	t.Header["kid"] = key.ID
	out, err := t.SignedString(key.Private)
	if err != nil {
		return "", fmt.Errorf("%s: %w", op, err)
	}
	return out, nil
}

func (s *Signer) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// checkName accepts what can be a kite identity field: non-empty, no '/', at most 256 bytes.
func checkName(what, v string) error {
	switch {
	case v == "":
		return fmt.Errorf("empty %s: %w", what, kite.ErrInvalidParams)
	case strings.Contains(v, "/"):
		return fmt.Errorf("%s %q contains '/': %w", what, v, kite.ErrInvalidParams)
	case len(v) > 256:
		return fmt.Errorf("%s is longer than 256 bytes: %w", what, kite.ErrInvalidParams)
	}
	return nil
}
