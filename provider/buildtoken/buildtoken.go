// Package buildtoken mints and checks the tokens of a provider's machine service: HS256 JWTs
// that a provider's ApplyTemplate mints for one stack build and hands to the stack's terraform
// as a sensitive variable, and that the service (mounted on kloud's HTTP server, see
// provider.HandlerPrefix) checks on every request. Start with Keyring (New, Mint, Parse) and
// Claims.
//
// The HMAC key lives in the provider's state directory (KeyFile, mode 0600, this process's
// user's): it survives a kloud restart, so a build that outlives its kloud still has a valid
// token, and terraform's sandbox cannot read it. The local and vagrant providers use it.
package buildtoken

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

const (
	// KeyFile is the HMAC key's file name in Options.Dir.
	KeyFile = ".service-key"
	keySize = 32
	// DefaultTTL is how long a token is valid: one stack build.
	DefaultTTL = time.Hour
)

// Options configure a Keyring.
type Options struct {
	Dir      string        // required: where KeyFile is kept (made 0700 on first use)
	Issuer   string        // required: the iss of its tokens ("kloud-local")
	Audience string        // required: the aud of its tokens ("kloud-local-machines/v1")
	Instance string        // this kloud's instance id: tokens of another instance are refused
	TTL      time.Duration // default DefaultTTL
}

// Keyring mints and checks one service's tokens.
type Keyring struct {
	o    Options
	mu   sync.Mutex
	hmac []byte // loaded or made on first use
}

// New returns a Keyring; the key is read or made on first use.
func New(o Options) *Keyring {
	if o.TTL <= 0 {
		o.TTL = DefaultTTL
	}
	return &Keyring{o: o}
}

// Claims are what a token allows: create of the listed kloud machine ids of the stack, and
// read, retag and delete of machines recorded as the stack's and this kloud instance's. Owner,
// if the service needs it, is the stack's owner.
type Claims struct {
	Stack    string   `json:"stack"`
	Owner    string   `json:"owner,omitempty"`
	Machines []string `json:"machines,omitempty"`
	Instance string   `json:"instance"`
	jwt.RegisteredClaims
}

// MayCreate reports whether the token lists kloud machine id mid.
func (c *Claims) MayCreate(mid string) bool {
	return mid != "" && slices.Contains(c.Machines, mid)
}

// key returns the service's HMAC key, creating it (0600) on first use. Concurrent first uses,
// also by other processes on the same state dir, end up with the same key.
func (k *Keyring) key() ([]byte, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.hmac != nil {
		return k.hmac, nil
	}
	p := filepath.Join(k.o.Dir, KeyFile)
	key, err := readKey(p)
	if errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(k.o.Dir, 0o700); err != nil {
			return nil, fmt.Errorf("service key: %w", err)
		}
		key = make([]byte, keySize)
		rand.Read(key)
		tmp, terr := os.CreateTemp(k.o.Dir, ".service-key-*")
		if terr != nil {
			return nil, fmt.Errorf("service key: %w", terr)
		}
		_, werr := tmp.Write(key)
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
		key, err = readKey(p)
	}
	if err != nil {
		return nil, err
	}
	k.hmac = key
	return key, nil
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

// Mint mints a token for the build of stack (of owner, "" if the service does not need it) that
// may create the given kloud machine ids (none: read, retag and destroy only).
func (k *Keyring) Mint(stack, owner string, machines []string) (string, error) {
	key, err := k.key()
	if err != nil {
		return "", err
	}
	now := time.Now()
	id := make([]byte, 12)
	rand.Read(id)
	c := Claims{
		Stack: stack, Owner: owner, Machines: machines, Instance: k.o.Instance,
		RegisteredClaims: jwt.RegisteredClaims{
			Issuer: k.o.Issuer, Audience: jwt.ClaimStrings{k.o.Audience}, Subject: stack,
			IssuedAt: jwt.NewNumericDate(now), ExpiresAt: jwt.NewNumericDate(now.Add(k.o.TTL)),
			ID: fmt.Sprintf("%x", id),
		},
	}
	return jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(key)
}

// Parse verifies a token: signature, issuer, audience, expiry, a stack, and this kloud instance.
// With allowExpired, a token past its expiry that is otherwise valid (checked as of a moment
// before it expired) is accepted: reading and destroying a stack's machines happen long after the
// build that minted the token (terraform destroy reuses the last apply's variables), and they
// stay limited to that stack's machines; creating and retagging need a live token.
func (k *Keyring) Parse(s string, allowExpired bool) (*Claims, error) {
	key, err := k.key()
	if err != nil {
		return nil, err
	}
	parse := func(c *Claims, opts ...jwt.ParserOption) error {
		opts = append([]jwt.ParserOption{jwt.WithValidMethods([]string{jwt.SigningMethodHS256.Alg()}), jwt.WithIssuer(k.o.Issuer),
			jwt.WithAudience(k.o.Audience), jwt.WithExpirationRequired(), jwt.WithIssuedAt(), jwt.WithLeeway(5 * time.Second)}, opts...)
		_, err := jwt.ParseWithClaims(s, c, func(*jwt.Token) (any, error) { return key, nil }, opts...)
		return err
	}
	var c Claims
	err = parse(&c)
	if err != nil && allowExpired && errors.Is(err, jwt.ErrTokenExpired) && c.ExpiresAt != nil {
		// Everything again, as of just before the expiry the (signed) token states.
		at := c.ExpiresAt.Time.Add(-time.Second)
		c = Claims{}
		err = parse(&c, jwt.WithTimeFunc(func() time.Time { return at }))
	}
	if err != nil {
		return nil, err
	}
	if c.Stack == "" {
		return nil, errors.New("token names no stack")
	}
	if c.Instance != k.o.Instance {
		return nil, fmt.Errorf("token of kloud instance %q, this is %q", c.Instance, k.o.Instance)
	}
	return &c, nil
}
