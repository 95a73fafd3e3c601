package klient

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/klient/klientapi"
	"github.com/kloud-dev/kloud/userdata"
)

func (kl *Klient) path(p string) string { return filepath.Join(kl.opts.Root, p) }

func (kl *Klient) provisionState() *ProvisionState {
	var st ProvisionState
	var ps userdata.ProvisionStatus
	if readJSON(kl.path(userdata.ProvisionStatusPath), &ps) {
		st.Provision = &ps
	}
	var us userdata.UserScriptStatus
	if readJSON(kl.path(userdata.UserScriptStatusPath), &us) {
		st.UserScript = &us
	}
	if st.Provision == nil && st.UserScript == nil {
		return nil
	}
	return &st
}

func readJSON(path string, v any) bool {
	b, err := os.ReadFile(path)
	return err == nil && json.Unmarshal(b, v) == nil
}

func (kl *Klient) logs(ctx context.Context, r *kite.Request, p *LogsParams) (any, error) {
	if err := kl.ownerOrKloud(r); err != nil {
		return nil, err
	}
	n := p.Bytes
	if n == 0 {
		n = 8 << 10
	}
	name, _ := klientapi.LogPath(p.Name) // Validate checked it
	f, err := os.Open(kl.path(name))
	if err != nil {
		return nil, fmt.Errorf("log %s: %w", p.Name, kite.ErrNotFound)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	off := max(fi.Size()-n, 0)
	b, err := io.ReadAll(io.NewSectionReader(f, off, n))
	if err != nil {
		return nil, fmt.Errorf("log %s: %w", p.Name, err)
	}
	if off > 0 {
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return LogsResult{Name: p.Name, Tail: string(bytes.ToValidUTF8(b, []byte("?"))), Truncated: off > 0}, nil
}

// ownerOrKloud allows calls over the registration connection (from kloud, which authorised the
// user) and direct calls by the machine's owner.
func (kl *Klient) ownerOrKloud(r *kite.Request) error {
	if r.Conn.Dialed() || r.Username() == kl.opts.Owner {
		return nil
	}
	return fmt.Errorf("%s is for the machine's owner: %w", r.Method, kite.ErrPermission)
}

type keyCache struct {
	mu   sync.Mutex
	keys []kitekey.PublicKey
}

func (c *keyCache) set(k []kitekey.PublicKey) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.keys = k
}

func (c *keyCache) get() []kitekey.PublicKey {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.keys
}
