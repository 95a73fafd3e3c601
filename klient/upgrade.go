package klient

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/kloud-dev/kloud/internal/filehash"
	"github.com/kloud-dev/kloud/internal/version"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/klient/klientapi"
)

// Upgrades: klient.upgrade (klientapi.MethodUpgrade) replaces klient's binary with the one kloud
// serves and restarts klient in place: Run returns a *RestartError once the answer is out, and
// cmd/klient execs the new binary (same pid, same arguments: systemd and the restart loop see
// nothing). The terminal sessions' holders are left running (webterm.Manager.Detach) and the
// new klient reconnects to them.

// maxKlientBinary bounds a download.
const maxKlientBinary = 512 << 20

// restartDelay lets klient.upgrade's answer reach kloud before klient restarts.
const restartDelay = 300 * time.Millisecond

// RestartError is what Run returns when klient must restart as Binary (an upgrade installed it):
// its caller execs Binary with klient's own arguments.
type RestartError struct {
	Binary string
}

func (e *RestartError) Error() string { return "klient restarts as " + e.Binary }

// upgrader is klient's upgrade state.
type upgrader struct {
	mu      sync.Mutex // one upgrade at a time
	restart chan string
	sumOnce sync.Once
	sum     string
}

func (kl *Klient) handleUpgrade() {
	kl.kite.Handle(klientapi.MethodUpgrade, kite.Typed(kl.upgrade), kite.WithTimeout(5*time.Minute))
}

// ownSHA256 is the SHA-256 of the running binary (computed once).
func (kl *Klient) ownSHA256() string {
	kl.up.sumOnce.Do(func() {
		kl.up.sum, _ = filehash.SHA256("/proc/self/exe")
	})
	return kl.up.sum
}

func (kl *Klient) upgrade(ctx context.Context, r *kite.Request, p *klientapi.UpgradeParams) (any, error) {
	if !r.Conn.Dialed() {
		return nil, fmt.Errorf("%s: only kloud, on the connection klient dialed, upgrades klient: %w", r.Method, kite.ErrPermission)
	}
	exe, unlock, err := kl.beginRestart(r.Method)
	if err != nil {
		return nil, err
	}
	defer unlock()
	src, err := klientapi.DownloadURL(kl.opts.KontrolURL)
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %w", r.Method, err, kite.ErrState)
	}
	newVersion, err := kl.fetchBinary(ctx, src, p.SHA256, exe)
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %w", r.Method, err, kite.ErrState)
	}
	res := klientapi.UpgradeResult{OldVersion: version.Version, NewVersion: newVersion, OldSHA256: kl.ownSHA256(), NewSHA256: p.SHA256,
		Sessions: len(kl.term.List())}
	kl.log.Info("klient upgraded: restarting", "binary", exe, "old", res.OldVersion, "new", res.NewVersion, "sha256", p.SHA256)
	kl.restartSoon(exe)
	return res, nil
}

// beginRestart takes the upgrade lock for a call of method that ends with a restart in place
// (klient.upgrade, klient.adopt: one at a time) and returns klient's own binary and the unlock.
func (kl *Klient) beginRestart(method string) (exe string, unlock func(), err error) {
	if !kl.up.mu.TryLock() {
		return "", nil, fmt.Errorf("%s: an upgrade or a handover is under way: %w", method, kite.ErrConflict)
	}
	exe, err = os.Executable()
	if err == nil {
		exe, err = filepath.EvalSymlinks(exe)
	}
	if err != nil {
		kl.up.mu.Unlock()
		return "", nil, fmt.Errorf("%s: own binary: %w: %w", method, err, kite.ErrState)
	}
	return exe, kl.up.mu.Unlock, nil
}

// restartSoon makes Run return a restart as exe once restartDelay has passed (the call's answer
// is out by then).
func (kl *Klient) restartSoon(exe string) {
	go func() {
		time.Sleep(restartDelay)
		select {
		case kl.up.restart <- exe:
		default: // a restart is pending already
		}
	}()
}

// fetchBinary downloads src next to exe, checks its sha256 and that it runs, and renames it
// over exe. It returns the new binary's version. On any error exe is untouched.
func (kl *Klient) fetchBinary(ctx context.Context, src, want, exe string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, src, nil)
	if err != nil {
		return "", err
	}
	hc := kl.hc
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return "", fmt.Errorf("download %s: %w", src, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("download %s: %s", src, resp.Status)
	}
	tmp, err := os.CreateTemp(filepath.Dir(exe), ".klient-upgrade-*")
	if err != nil {
		return "", fmt.Errorf("download: %w", err)
	}
	done := false
	defer func() {
		if !done {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), io.LimitReader(resp.Body, maxKlientBinary+1))
	if err != nil {
		return "", fmt.Errorf("download %s: %w", src, err)
	}
	if n > maxKlientBinary {
		return "", fmt.Errorf("download %s: more than %d MiB", src, maxKlientBinary>>20)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		return "", fmt.Errorf("download %s: sha256 mismatch: got %s, want %s (klient not replaced)", src, got, want)
	}
	if err := tmp.Chmod(0o755); err != nil {
		return "", err
	}
	if err := tmp.Sync(); err != nil {
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	vctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	out, err := exec.CommandContext(vctx, tmp.Name(), "--version").Output()
	cancel()
	if err != nil {
		return "", fmt.Errorf("the new klient does not run here (%s --version): %w (klient not replaced)", src, err)
	}
	newVersion := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(string(out)), "klient"))
	if err := os.Rename(tmp.Name(), exe); err != nil {
		return "", fmt.Errorf("install %s: %w", exe, err)
	}
	done = true
	return newVersion, nil
}

// IsRestart returns the binary to exec when err is Run's restart.
func IsRestart(err error) (string, bool) {
	var re *RestartError
	if errors.As(err, &re) {
		return re.Binary, true
	}
	return "", false
}
