package kitekey

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/kloud-dev/kloud/kite"
)

// FileStore is a KeyStore in one JSON file (mode 0600, directory 0700 created if missing), for
// a single kloud process: it serialises its own operations but does not lock against other
// processes. Every change rewrites the file atomically. A file that anyone but its owner can
// read, or that does not parse, is an error: it is never silently replaced, since new keys
// would invalidate every kite key in the field.
//
// The file holds {"version":1,"keys":[JWK + "d" (the private seed) + createdAt/retiredAt]}.
type FileStore struct {
	Path string
	mu   sync.Mutex
}

var _ KeyStore = (*FileStore)(nil)

type keyFile struct {
	Version int       `json:"version"`
	Keys    []fileKey `json:"keys"`
}

type fileKey struct {
	PublicKey
	D         string     `json:"d"`
	CreatedAt time.Time  `json:"createdAt"`
	RetiredAt *time.Time `json:"retiredAt,omitempty"`
}

// LoadKeys implements KeyStore. A missing file holds no keys.
func (s *FileStore) LoadKeys(ctx context.Context) ([]*KeyPair, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.load()
}

// AddKey implements KeyStore.
func (s *FileStore) AddKey(ctx context.Context, k *KeyPair) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys, err := s.load()
	if err != nil {
		return err
	}
	if slices.ContainsFunc(keys, func(kp *KeyPair) bool { return kp.ID == k.ID }) {
		return fmt.Errorf("keyring %s: key %q: %w", s.Path, k.ID, kite.ErrConflict)
	}
	return s.save(append(keys, k))
}

// RetireKey implements KeyStore.
func (s *FileStore) RetireKey(ctx context.Context, kid string, at time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys, err := s.load()
	if err != nil {
		return err
	}
	i := slices.IndexFunc(keys, func(kp *KeyPair) bool { return kp.ID == kid })
	if i < 0 {
		return fmt.Errorf("keyring %s: key %q: %w", s.Path, kid, kite.ErrNotFound)
	}
	if keys[i].Retired() {
		return nil
	}
	keys[i].RetiredAt = &at
	return s.save(keys)
}

func (s *FileStore) load() ([]*KeyPair, error) {
	st, err := os.Stat(s.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("keyring: %w", err)
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("keyring %s: mode %04o lets others read private keys; want 0600", s.Path, perm)
	}
	b, err := os.ReadFile(s.Path)
	if err != nil {
		return nil, fmt.Errorf("keyring: %w", err)
	}
	var f keyFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("keyring %s: %w", s.Path, err)
	}
	if f.Version != 1 {
		return nil, fmt.Errorf("keyring %s: version %d, want 1", s.Path, f.Version)
	}
	keys := make([]*KeyPair, 0, len(f.Keys))
	for n, fk := range f.Keys {
		pub, err := fk.PublicKey.Ed25519()
		if err != nil {
			return nil, fmt.Errorf("keyring %s: key %d: %w", s.Path, n, err)
		}
		seed, err := base64.RawURLEncoding.Strict().DecodeString(fk.D)
		if err != nil || len(seed) != ed25519.SeedSize {
			return nil, fmt.Errorf("keyring %s: key %q: private seed is not %d bytes of base64url", s.Path, fk.ID, ed25519.SeedSize)
		}
		priv := ed25519.NewKeyFromSeed(seed)
		if !pub.Equal(priv.Public()) {
			return nil, fmt.Errorf("keyring %s: key %q: private and public halves do not match", s.Path, fk.ID)
		}
		keys = append(keys, &KeyPair{ID: fk.ID, Private: priv, Public: pub, CreatedAt: fk.CreatedAt, RetiredAt: fk.RetiredAt})
	}
	return keys, nil
}

func (s *FileStore) save(keys []*KeyPair) error {
	f := keyFile{Version: 1, Keys: make([]fileKey, 0, len(keys))}
	for _, k := range keys {
		f.Keys = append(f.Keys, fileKey{
			PublicKey: k.JWK(),
			D:         base64.RawURLEncoding.EncodeToString(k.Private.Seed()),
			CreatedAt: k.CreatedAt,
			RetiredAt: k.RetiredAt,
		})
	}
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return fmt.Errorf("keyring %s: %w", s.Path, err)
	}
	if err := writeAtomic(s.Path, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("keyring: %w", err)
	}
	return nil
}

// FileKeyring is a Keyring on a FileStore: kontrol's signing keys in its data directory.
type FileKeyring struct {
	*Keyring
	Path string
}

// LoadOrCreateFileKeyring opens the keyring file at path, creating it (and its directory) with a
// fresh key if it does not exist.
func LoadOrCreateFileKeyring(path string) (*FileKeyring, error) {
	k, err := NewKeyring(context.Background(), KeyringOptions{Store: &FileStore{Path: path}})
	if err != nil {
		return nil, err
	}
	return &FileKeyring{Keyring: k, Path: path}, nil
}
