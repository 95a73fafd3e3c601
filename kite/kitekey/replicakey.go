package kitekey

import (
	"context"
	"crypto/rand"
	"fmt"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/kloud-dev/kloud/kite"
)

// Replica keys: the credential one kloud replica dials another with (kloud/mesh.go), to call
// the replica-facing methods (an agent call forwarded to the replica that holds the agent's
// connection). Every replica signs them with the shared keyring in the store, so any replica
// verifies any other's. A replica key proves "kloud replica R" and nothing else: its kind is
// its own (no user's kite key, session or token, no agent or plugin key passes for one, and a
// replica key passes for none of them), its sub "replica:<id>" is no username, and it expires
// (at most MaxReplicaKeyTTL: a replica mints a new one as it needs).

// KindReplicaKey is the kind of a replica key.
const KindReplicaKey = "replicaKey"

const (
	// ReplicaIDPrefix starts the jti (kite id) of every replica key.
	ReplicaIDPrefix = "replica."
	// ReplicaSubjectPrefix starts the sub of a replica key: "replica:<replica id>".
	ReplicaSubjectPrefix = "replica:"
	// MaxReplicaKeyTTL is the longest life of a replica key (exp - iat).
	MaxReplicaKeyTTL = time.Hour
)

// ReplicaKeyClaims are the claims of a replica key: iss = kontrol, sub =
// ReplicaSubjectPrefix + replica, jti = ReplicaIDPrefix + random, iat, nbf, exp.
type ReplicaKeyClaims struct {
	jwt.RegisteredClaims
	Kind    string `json:"kind"`
	Replica string `json:"replica"`
}

func (c *ReplicaKeyClaims) kind() string                      { return c.Kind }
func (c *ReplicaKeyClaims) registered() *jwt.RegisteredClaims { return &c.RegisteredClaims }

// ReplicaKey mints the key replica (its id, kloud/store's instance id) dials other replicas
// with, valid for ttl (at most MaxReplicaKeyTTL).
func (s *Signer) ReplicaKey(replica string, ttl time.Duration) (string, error) {
	if err := checkName("replica id", replica); err != nil {
		return "", fmt.Errorf("sign replica key: %w", err)
	}
	if ttl <= 0 || ttl > MaxReplicaKeyTTL {
		return "", fmt.Errorf("sign replica key: ttl %s not in (0, %s]: %w", ttl, MaxReplicaKeyTTL, kite.ErrInvalidParams)
	}
	now := s.now()
	return s.sign("sign replica key", &ReplicaKeyClaims{
		RegisteredClaims: jwt.RegisteredClaims{
			Issuer:    s.Issuer,
			Subject:   ReplicaSubjectPrefix + replica,
			ID:        ReplicaIDPrefix + strings.ToLower(rand.Text()),
			IssuedAt:  jwt.NewNumericDate(now),
			NotBefore: jwt.NewNumericDate(now),
			ExpiresAt: jwt.NewNumericDate(now.Add(ttl)),
		},
		Kind:    KindReplicaKey,
		Replica: replica,
	})
}

// ReplicaKey verifies a replica key: on top of the checks of every kind, sub must be
// ReplicaSubjectPrefix + replica and jti start with ReplicaIDPrefix.
func (v *Verifier) ReplicaKey(ctx context.Context, raw string) (*ReplicaKeyClaims, error) {
	c := &ReplicaKeyClaims{}
	if err := v.verify(ctx, "replica key", raw, KindReplicaKey, c, MaxReplicaKeyTTL, ""); err != nil {
		return nil, err
	}
	switch {
	case checkName("replica id", c.Replica) != nil || c.Subject != ReplicaSubjectPrefix+c.Replica:
		return nil, fmt.Errorf("replica key: %w: sub %q does not name replica %q", ErrMissingClaim, short(c.Subject), short(c.Replica))
	case !strings.HasPrefix(c.ID, ReplicaIDPrefix):
		return nil, fmt.Errorf("replica key: %w: jti %q is not a replica's", ErrMalformed, short(c.ID))
	}
	return c, nil
}

func (a *Authenticator) replica(ctx context.Context, raw string) (*kite.Principal, error) {
	c, err := a.Verifier.ReplicaKey(ctx, raw)
	if err != nil {
		return nil, err
	}
	if !a.Replicas {
		return nil, fmt.Errorf("replica key of %q: %w: replica keys are accepted only by kloud", short(c.Replica), ErrWrongKind)
	}
	return &kite.Principal{Username: c.Subject, Type: KindReplicaKey, KiteID: c.ID, TokenID: c.ID, Expires: c.ExpiresAt.Time}, nil
}

// IsReplica reports whether p is another kloud replica (authenticated with a replica key).
func IsReplica(p *kite.Principal) bool {
	return p != nil && p.Type == KindReplicaKey && strings.HasPrefix(p.Username, ReplicaSubjectPrefix)
}

// ReplicaName is the replica id a replica principal proved ("" if p is not a replica).
func ReplicaName(p *kite.Principal) string {
	if !IsReplica(p) {
		return ""
	}
	return strings.TrimPrefix(p.Username, ReplicaSubjectPrefix)
}

// ReplicaRefused is the error every method that is not replica-facing returns to a replica key:
// -32002.
func ReplicaRefused(r *kite.Request) error {
	return fmt.Errorf("%s: replica keys may only call the replica-facing methods (this is the key of replica %s): %w",
		r.Method, short(ReplicaName(r.Principal())), kite.ErrPermission)
}
