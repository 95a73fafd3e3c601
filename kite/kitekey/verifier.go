package kitekey

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/golang-jwt/jwt/v5"
)

// DefaultLeeway is the clock skew Verifier allows when Leeway is zero.
const DefaultLeeway = 30 * time.Second

// MaxLen is the longest credential Verifier will look at; a kite key is about 400 bytes.
const MaxLen = 8 << 10

// Verifier checks kite keys, agent keys, tokens and sessions. Every rejection wraps kite.ErrAuth and one of
// the reasons in errors.go. Errors that are not about the credential (no Keys configured, a key
// source or revocation list that cannot be reached) do not wrap kite.ErrAuth.
//
// Checks, in order: the text is three strict base64url segments of at most MaxLen bytes; the
// header has alg EdDSA, a kid and no crit; the key for kid is known and not retired; the
// signature verifies; kind is the one asked for; iss equals Issuer; sub, jti and iat are set
// (exp too for tokens and sessions); iat and nbf are not in the future and exp is not past, all
// with Leeway; aud is exactly the one kite id for tokens and absent otherwise; exp-iat is at most
// MaxTokenTTL or MaxSessionTTL (plus Leeway); jti is not revoked.
//
// The Ed25519 check is done once per credential: a credential whose signature verified is
// remembered (by the SHA-256 of its whole text, so a copied signature never vouches for other
// claims) with the public key it verified under, until its exp, or for SignatureCacheTTL when it
// has none. Every other check runs on every call: the key must still be known and the same
// (a retired key refuses at once), and time, audience and revocation are checked as above.
type Verifier struct {
	Keys    KeySource     // required
	Issuer  string        // required: the iss every credential must carry
	Revoked Revoker       // optional: consulted for the jti of every credential
	Leeway  time.Duration // clock skew allowed; 0 means DefaultLeeway, negative means none
	Now     func() time.Time

	// sigs is the *sigCache, made on first use (atomically: a Verifier is a plain struct
	// literal; copies made after its first use share the cache).
	sigs unsafe.Pointer
}

func (v *Verifier) cache() *sigCache {
	if p := atomic.LoadPointer(&v.sigs); p != nil {
		return (*sigCache)(p)
	}
	atomic.CompareAndSwapPointer(&v.sigs, nil, unsafe.Pointer(&sigCache{}))
	return (*sigCache)(atomic.LoadPointer(&v.sigs))
}

// SignatureCacheTTL is how long Verifier remembers a verified signature of a credential without
// exp (kite keys, agent keys).
const SignatureCacheTTL = time.Hour

// maxCachedSignatures bounds the cache: past it, expired entries are dropped, and if none are,
// the cache starts again empty.
const maxCachedSignatures = 1 << 16

// sigCache remembers credentials whose signature verified.
type sigCache struct {
	mu sync.Mutex
	m  map[[sha256.Size]byte]sigEntry
}

type sigEntry struct {
	key   ed25519.PublicKey // the key it verified under
	until time.Time
}

func (s *sigCache) verified(sum [sha256.Size]byte, key ed25519.PublicKey, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.m[sum]
	return ok && now.Before(e.until) && e.key.Equal(key)
}

func (s *sigCache) remember(sum [sha256.Size]byte, key ed25519.PublicKey, until, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[[sha256.Size]byte]sigEntry{}
	}
	if len(s.m) >= maxCachedSignatures {
		for k, e := range s.m {
			if !now.Before(e.until) {
				delete(s.m, k)
			}
		}
		if len(s.m) >= maxCachedSignatures {
			clear(s.m)
		}
	}
	s.m[sum] = sigEntry{key: key, until: until}
}

// KiteKey verifies a kite key.
func (v *Verifier) KiteKey(ctx context.Context, raw string) (*KiteKeyClaims, error) {
	c := &KiteKeyClaims{}
	if err := v.verify(ctx, "kite key", raw, KindKiteKey, c, 0, ""); err != nil {
		return nil, err
	}
	return c, nil
}

// AgentKey verifies a machine agent's key: on top of the checks of every kind, sub must be
// MachineSubject(machineId), jti must start with AgentIDPrefix and owner must be set.
func (v *Verifier) AgentKey(ctx context.Context, raw string) (*AgentKeyClaims, error) {
	c := &AgentKeyClaims{}
	if err := v.verify(ctx, "agent key", raw, KindAgentKey, c, 0, ""); err != nil {
		return nil, err
	}
	switch {
	case c.MachineID == "" || c.Subject != MachineSubject(c.MachineID):
		return nil, fmt.Errorf("agent key: %w: sub %q does not name machine %q", ErrMissingClaim, short(c.Subject), short(c.MachineID))
	case !strings.HasPrefix(c.ID, AgentIDPrefix):
		return nil, fmt.Errorf("agent key: %w: jti %q is not an agent's kite id", ErrMalformed, short(c.ID))
	case c.Owner == "" || strings.ContainsAny(c.Owner, ":/"):
		return nil, fmt.Errorf("agent key: %w: owner %q", ErrMissingClaim, short(c.Owner))
	}
	return c, nil
}

// PluginKey verifies an out-of-process provider's key: on top of the checks of every kind, sub
// must be PluginSubject(provider), provider a valid name and jti start with PluginIDPrefix. exp
// is optional; if present it is checked like every exp.
func (v *Verifier) PluginKey(ctx context.Context, raw string) (*PluginKeyClaims, error) {
	c := &PluginKeyClaims{}
	if err := v.verify(ctx, "plugin key", raw, KindPluginKey, c, 0, ""); err != nil {
		return nil, err
	}
	switch {
	case ValidProviderName(c.Provider) != nil || c.Subject != PluginSubject(c.Provider):
		return nil, fmt.Errorf("plugin key: %w: sub %q does not name provider %q", ErrMissingClaim, short(c.Subject), short(c.Provider))
	case !strings.HasPrefix(c.ID, PluginIDPrefix):
		return nil, fmt.Errorf("plugin key: %w: jti %q is not a plugin's kite id", ErrMalformed, short(c.ID))
	}
	return c, nil
}

// Token verifies a token whose audience must be exactly audienceKiteID.
func (v *Verifier) Token(ctx context.Context, raw, audienceKiteID string) (*TokenClaims, error) {
	c := &TokenClaims{}
	if err := v.verify(ctx, "token", raw, KindToken, c, MaxTokenTTL, audienceKiteID); err != nil {
		return nil, err
	}
	return c, nil
}

// Session verifies a session.
func (v *Verifier) Session(ctx context.Context, raw string) (*SessionClaims, error) {
	c := &SessionClaims{}
	if err := v.verify(ctx, "session", raw, KindSession, c, MaxSessionTTL, ""); err != nil {
		return nil, err
	}
	return c, nil
}

func (v *Verifier) leeway() time.Duration {
	switch {
	case v.Leeway == 0:
		return DefaultLeeway
	case v.Leeway < 0:
		return 0
	}
	return v.Leeway
}

func (v *Verifier) now() time.Time {
	if v.Now != nil {
		return v.Now()
	}
	return time.Now()
}

// verify checks raw as a credential of kind into c. maxTTL > 0 requires exp and bounds exp-iat;
// aud is the one audience a token must name ("" for kinds without an audience).
func (v *Verifier) verify(ctx context.Context, what, raw, kind string, c claims, maxTTL time.Duration, aud string) error {
	if v == nil || v.Keys == nil || v.Issuer == "" {
		return fmt.Errorf("%s: verifier needs Keys and Issuer", what)
	}
	hdr, err := parseHeader(raw)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}

	// Signature. The parser decodes strictly (one encoding per token); the signature is verified
	// once per credential and key (sigCache).
	p := jwt.NewParser(jwt.WithValidMethods([]string{AlgEdDSA}), jwt.WithStrictDecoding(), jwt.WithoutClaimsValidation())
	tok, parts, err := p.ParseUnverified(raw, c)
	if err != nil {
		return fmt.Errorf("%s: %w: %w", what, ErrMalformed, err)
	}
	if tok.Method == nil || tok.Method.Alg() != AlgEdDSA {
		return fmt.Errorf("%s: %w: alg %q, only %s is accepted", what, ErrAlgorithm, short(hdr.alg), AlgEdDSA)
	}
	key, keyErr := v.Keys.PublicKey(ctx, hdr.kid)
	switch {
	case keyErr != nil && errors.Is(keyErr, ErrUnknownKey):
		return fmt.Errorf("%s: %w", what, keyErr)
	case keyErr != nil:
		return fmt.Errorf("%s: look up signing key %q: %w", what, short(hdr.kid), keyErr)
	}
	sum := sha256.Sum256([]byte(raw))
	if !v.cache().verified(sum, key, v.now()) {
		if err := tok.Method.Verify(parts[0]+"."+parts[1], tok.Signature, key); err != nil {
			return fmt.Errorf("%s: %w (signing key %q)", what, ErrBadSignature, hdr.kid)
		}
		now := v.now()
		until := now.Add(SignatureCacheTTL)
		if rc := c.registered(); rc.ExpiresAt != nil && rc.ExpiresAt.Time.Before(until) {
			until = rc.ExpiresAt.Time.Add(v.leeway())
		}
		v.cache().remember(sum, key, until, now)
	}

	// Claims. The signature is good, so from here on the reasons may quote claim values.
	if c.kind() != kind {
		return fmt.Errorf("%s: %w: kind %q, want %q", what, ErrWrongKind, short(c.kind()), kind)
	}
	rc := c.registered()
	if rc.Issuer != v.Issuer {
		return fmt.Errorf("%s: %w: iss %q, want %q", what, ErrWrongIssuer, short(rc.Issuer), v.Issuer)
	}
	switch {
	case rc.Subject == "":
		return fmt.Errorf("%s: %w: no sub", what, ErrMissingClaim)
	case rc.ID == "":
		return fmt.Errorf("%s: %w: no jti", what, ErrMissingClaim)
	case rc.IssuedAt == nil:
		return fmt.Errorf("%s: %w: no iat", what, ErrMissingClaim)
	case maxTTL > 0 && rc.ExpiresAt == nil:
		return fmt.Errorf("%s: %w: no exp (a %s must expire)", what, ErrLifetime, kind)
	}
	now, leeway := v.now(), v.leeway()
	opts := []jwt.ParserOption{jwt.WithLeeway(leeway), jwt.WithTimeFunc(func() time.Time { return now }),
		jwt.WithIssuer(v.Issuer), jwt.WithIssuedAt()}
	if maxTTL > 0 {
		opts = append(opts, jwt.WithExpirationRequired())
	}
	if err := jwt.NewValidator(opts...).Validate(c); err != nil {
		return fmt.Errorf("%s: %w", what, timeReason(err, rc, now, leeway))
	}
	if aud != "" || kind == KindToken {
		if len(rc.Audience) != 1 || aud == "" || rc.Audience[0] != aud {
			return fmt.Errorf("%s: %w: aud %q, want exactly [%q]", what, ErrWrongAudience, shortAll(rc.Audience), aud)
		}
	} else if len(rc.Audience) != 0 {
		return fmt.Errorf("%s: %w: aud %q, a %s has none", what, ErrWrongAudience, shortAll(rc.Audience), kind)
	}
	if maxTTL > 0 {
		if life := rc.ExpiresAt.Sub(rc.IssuedAt.Time); life > maxTTL+leeway {
			return fmt.Errorf("%s: %w: valid for %s after iat, at most %s allowed", what, ErrLifetime, life, maxTTL)
		}
	}
	if v.Revoked != nil {
		revoked, err := v.Revoked.IsRevoked(ctx, rc.ID)
		if err != nil {
			return fmt.Errorf("%s: check revocation of %q: %w", what, rc.ID, err)
		}
		if revoked {
			return fmt.Errorf("%s: %w: jti %q", what, ErrRevoked, rc.ID)
		}
	}
	return nil
}

// timeReason turns the validator's (joined) error into one reason.
func timeReason(err error, rc *jwt.RegisteredClaims, now time.Time, leeway time.Duration) error {
	at := func(d *jwt.NumericDate) string { return d.UTC().Format(time.RFC3339) }
	n := now.UTC().Format(time.RFC3339)
	switch {
	case errors.Is(err, jwt.ErrTokenExpired):
		return fmt.Errorf("%w at %s (now %s, leeway %s)", ErrExpired, at(rc.ExpiresAt), n, leeway)
	case errors.Is(err, jwt.ErrTokenNotValidYet):
		return fmt.Errorf("%w: nbf %s (now %s, leeway %s)", ErrNotYetValid, at(rc.NotBefore), n, leeway)
	case errors.Is(err, jwt.ErrTokenUsedBeforeIssued):
		return fmt.Errorf("%w: issued in the future at %s (now %s, leeway %s)", ErrNotYetValid, at(rc.IssuedAt), n, leeway)
	case errors.Is(err, jwt.ErrTokenInvalidIssuer):
		return fmt.Errorf("%w: iss %q", ErrWrongIssuer, short(rc.Issuer))
	case errors.Is(err, jwt.ErrTokenRequiredClaimMissing):
		return fmt.Errorf("%w: %w", ErrMissingClaim, err)
	}
	return fmt.Errorf("%w: %w", ErrMalformed, err)
}

type header struct{ alg, kid string }

// parseHeader checks the shape of raw and reads alg and kid from its header. Only the
// base64url alphabet and two dots are allowed: the decoder would otherwise skip newlines, and a
// token could have more than one spelling.
func parseHeader(raw string) (header, error) {
	var h header
	switch {
	case raw == "":
		return h, fmt.Errorf("%w: empty", ErrMalformed)
	case len(raw) > MaxLen:
		return h, fmt.Errorf("%w: %d bytes, at most %d allowed", ErrMalformed, len(raw), MaxLen)
	}
	parts := strings.Split(raw, ".")
	if len(parts) != 3 {
		return h, fmt.Errorf("%w: not a JWT: %d dot-separated parts, want 3", ErrMalformed, len(parts))
	}
	for _, p := range parts {
		if strings.IndexFunc(p, notBase64URL) >= 0 {
			return h, fmt.Errorf("%w: not a JWT: a part is not base64url", ErrMalformed)
		}
	}
	if parts[0] == "" || parts[1] == "" {
		return h, fmt.Errorf("%w: not a JWT: empty header or claims", ErrMalformed)
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(parts[0])
	if err != nil {
		return h, fmt.Errorf("%w: header: %w", ErrMalformed, err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return h, fmt.Errorf("%w: header: %w", ErrMalformed, err)
	}
	if _, ok := m["crit"]; ok {
		return h, fmt.Errorf("%w: header has crit, which is not supported", ErrMalformed)
	}
	if a, ok := m["alg"]; !ok || json.Unmarshal(a, &h.alg) != nil {
		return h, fmt.Errorf("%w: header has no alg string", ErrAlgorithm)
	}
	if h.alg != AlgEdDSA {
		return h, fmt.Errorf("%w: alg %q, only %s is accepted", ErrAlgorithm, short(h.alg), AlgEdDSA)
	}
	if k, ok := m["kid"]; !ok || json.Unmarshal(k, &h.kid) != nil || h.kid == "" {
		return h, fmt.Errorf("%w: header has no kid", ErrUnknownKey)
	}
	if parts[2] == "" {
		return h, fmt.Errorf("%w: no signature", ErrBadSignature)
	}
	return h, nil
}

func notBase64URL(r rune) bool {
	return !(r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_')
}

// short bounds untrusted text quoted in errors.
func short(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

func shortAll(ss []string) []string {
	out := make([]string, 0, len(ss))
	for _, s := range ss {
		out = append(out, short(s))
	}
	return out
}
