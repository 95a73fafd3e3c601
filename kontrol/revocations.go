package kontrol

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/google/uuid"
)

// FileRevocations keeps revoked ids in a JSON file (0600) in kontrol's data directory. It is the
// store for a kontrol without a database; kloud's store provides the shared one.
type FileRevocations struct {
	path string
	mu   sync.RWMutex
	set  map[string]revocation
}

type revocation struct {
	Reason    string    `json:"reason,omitempty"`
	RevokedAt time.Time `json:"revokedAt"`
}

// OpenFileRevocations loads (or starts) the revocation list at path.
func OpenFileRevocations(path string) (*FileRevocations, error) {
	r := &FileRevocations{path: path, set: map[string]revocation{}}
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return r, nil
	case err != nil:
		return nil, fmt.Errorf("revocations: %w", err)
	}
	if err := json.Unmarshal(b, &r.set); err != nil {
		return nil, fmt.Errorf("revocations %s: %w", path, err)
	}
	return r, nil
}

// IsRevoked implements kitekey.Revoker.
func (r *FileRevocations) IsRevoked(_ context.Context, jti string) (bool, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	_, ok := r.set[jti]
	return ok, nil
}

// Revoke records jti as revoked.
func (r *FileRevocations) Revoke(_ context.Context, jti, reason string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.set[jti] = revocation{Reason: reason, RevokedAt: time.Now().UTC()}
	b, err := json.MarshalIndent(r.set, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(r.path), 0o700); err != nil {
		return fmt.Errorf("revocations: %w", err)
	}
	tmp := r.path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("revocations: %w", err)
	}
	return os.Rename(tmp, r.path)
}

func newID() string { return uuid.NewString() }
