package vagrant

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Tokens of the vagrant machine service (service.go): HS256 JWTs that ApplyTemplate mints for one
// stack build and hands to the stack's terraform as a sensitive variable.
const (
	tokenIssuer   = "kloud-vagrant"
	tokenAudience = "kloud-vagrant-machines/v1"
	// KeyFile is the service's HMAC key in the state dir (0600, root's): it survives a kloud
	// restart, so a build that outlives its kloud (terraformer runs on) still has a valid token.
	KeyFile = ".service-key"
	keySize = 32
	// DefaultTokenTTL is how long a token is valid: one stack build (Options.TokenTTL).
	DefaultTokenTTL = time.Hour
)

// tokenClaims are what a token allows: create of the listed kloud machine ids of the stack, and
// read, retag and delete of machines recorded as the stack's and this kloud instance's.
type tokenClaims struct {
	Stack string `json:"stack"`
	// Owner is the stack's owner: the service works on that user's vagrant host only.
	Owner    string   `json:"owner"`
	Machines []string `json:"machines,omitempty"`
	Instance string   `json:"instance"`
	jwt.RegisteredClaims
}

// mayCreate reports whether the token lists kloud machine id mid.
func (c *tokenClaims) mayCreate(mid string) bool {
	return mid != "" && slices.Contains(c.Machines, mid)
}

// key returns the service's HMAC key, creating it (0600) on first use. Concurrent first uses,
// also by other processes on the same state dir, end up with the same key.
func (v *Vagrant) key() ([]byte, error) {
	v.keyMu.Lock()
	defer v.keyMu.Unlock()
	if v.hmacKey != nil {
		return v.hmacKey, nil
	}
	p := filepath.Join(v.stateDir, KeyFile)
	k, err := readKey(p)
	if errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(v.stateDir, 0o700); err != nil {
			return nil, fmt.Errorf("service key: %w", err)
		}
		k = make([]byte, keySize)
		rand.Read(k)
		tmp, terr := os.CreateTemp(v.stateDir, ".service-key-*")
		if terr != nil {
			return nil, fmt.Errorf("service key: %w", terr)
		}
		_, werr := tmp.Write(k)
		if cerr := tmp.Close(); werr == nil {
			werr = cerr
		}
		if werr == nil {
			// Link, not rename: a key another process created meanwhile wins.
			if err := os.Link(tmp.Name(), p); err != nil && !errors.Is(err, fs.ErrExist) {
				werr = err
			}
		}
		os.Remove(tmp.Name())
		if werr != nil {
			return nil, fmt.Errorf("service key: %w", werr)
		}
		k, err = readKey(p)
	}
	if err != nil {
		return nil, err
	}
	v.hmacKey = k
	return k, nil
}

// readKey reads the key file, refusing one that others than its owner (root) may read or that
// another user owns.
func readKey(p string) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("service key: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 || !st.Mode().IsRegular() {
		return nil, fmt.Errorf("service key %s: mode %s; want a regular file of mode 0600", p, st.Mode())
	}
	if s, ok := st.Sys().(*syscall.Stat_t); ok && int(s.Uid) != os.Geteuid() {
		return nil, fmt.Errorf("service key %s: owned by uid %d, not by this process's user", p, s.Uid)
	}
	k := make([]byte, keySize+1)
	n, _ := f.Read(k)
	if n != keySize {
		return nil, fmt.Errorf("service key %s: %d bytes, want %d", p, n, keySize)
	}
	return k[:n], nil
}

// Token mints a token of the vagrant machine service for the build of stack (of owner) that may create the given
// kloud machine ids (none: read, retag and destroy only). ApplyTemplate uses it.
func (v *Vagrant) Token(stack, owner string, machines []string) (string, error) {
	k, err := v.key()
	if err != nil {
		return "", err
	}
	now := time.Now()
	id := make([]byte, 12)
	rand.Read(id)
	c := tokenClaims{
		Stack: stack, Owner: owner, Machines: machines, Instance: v.instance,
		RegisteredClaims: jwt.RegisteredClaims{
			Issuer: tokenIssuer, Audience: jwt.ClaimStrings{tokenAudience}, Subject: stack,
			IssuedAt: jwt.NewNumericDate(now), ExpiresAt: jwt.NewNumericDate(now.Add(v.tokenTTL)),
			ID: fmt.Sprintf("%x", id),
		},
	}
	return jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(k)
}

// parseToken verifies a token: signature, issuer, audience, expiry, and this kloud instance.
// With allowExpired, a token past its expiry that is otherwise valid (checked as of a moment
// before it expired) is accepted: reading and destroying a stack's machines happen long after the
// build that minted the token (terraform destroy reuses the last apply's variables), and they
// stay limited to that stack's machines; creating and retagging need a live token.
func (v *Vagrant) parseToken(s string, allowExpired bool) (*tokenClaims, error) {
	k, err := v.key()
	if err != nil {
		return nil, err
	}
	parse := func(c *tokenClaims, opts ...jwt.ParserOption) error {
		opts = append([]jwt.ParserOption{jwt.WithValidMethods([]string{jwt.SigningMethodHS256.Alg()}), jwt.WithIssuer(tokenIssuer),
			jwt.WithAudience(tokenAudience), jwt.WithExpirationRequired(), jwt.WithIssuedAt(), jwt.WithLeeway(5 * time.Second)}, opts...)
		_, err := jwt.ParseWithClaims(s, c, func(*jwt.Token) (any, error) { return k, nil }, opts...)
		return err
	}
	var c tokenClaims
	err = parse(&c)
	if err != nil && allowExpired && errors.Is(err, jwt.ErrTokenExpired) && c.ExpiresAt != nil {
		// Everything again, as of just before the expiry the (signed) token states.
		at := c.ExpiresAt.Time.Add(-time.Second)
		c = tokenClaims{}
		err = parse(&c, jwt.WithTimeFunc(func() time.Time { return at }))
	}
	if err != nil {
		return nil, err
	}
	if c.Stack == "" || c.Owner == "" {
		return nil, errors.New("token names no stack or no owner")
	}
	if c.Instance != v.instance {
		return nil, fmt.Errorf("token of kloud instance %q, this is %q", c.Instance, v.instance)
	}
	return &c, nil
}
