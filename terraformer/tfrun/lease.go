package tfrun

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kloud-dev/kloud/internal/atomicfile"
)

// lease is the on-disk lease of one content id. Every read-modify-write of lease.json happens under
// an exclusive flock on lease.lock, and lease.json is replaced with a rename, so a reader never sees
// half a lease and two processes (or two engines in one process) never both win. A process that
// dies stops renewing; its lease is then free once Expires has passed.
type lease struct {
	Owner    string    `json:"owner"`
	JobID    string    `json:"jobId"`
	Acquired time.Time `json:"acquired"`
	Expires  time.Time `json:"expires"`
}

func (l *lease) heldAt(now time.Time) bool { return l != nil && now.Before(l.Expires) }

type leaseFile struct {
	dir string // the stack dir
}

func (lf leaseFile) path() string { return filepath.Join(lf.dir, "lease.json") }

// locked runs fn with the flock held.
func (lf leaseFile) locked(fn func() error) error {
	f, err := os.OpenFile(filepath.Join(lf.dir, "lease.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("lease lock: %w", err)
	}
	defer f.Close()
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("lease lock: %w", err)
	}
	defer syscall.Flock(int(f.Fd()), syscall.LOCK_UN) //nolint:errcheck // closing unlocks too
	return fn()
}

// read returns the current lease, or nil when there is none.
func (lf leaseFile) read() (*lease, error) {
	b, err := os.ReadFile(lf.path())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read lease: %w", err)
	}
	var l lease
	if err := json.Unmarshal(b, &l); err != nil {
		// A lease file is only ever replaced by rename, so this is not a torn write: treat a
		// corrupt file as no lease rather than locking the stack forever.
		return nil, nil
	}
	return &l, nil
}

// ownerGone reports whether a lease's owner is an engine of a process that is gone: its owner
// is the default "host:pid:random" of this host and that pid no longer runs (a terraformer
// killed, e.g. with kloud). Its lease is then free at once, not after its TTL, so the run that
// died with it can be started again right away; the terraform it ran died with it (its pid
// namespace). Another host's lease, or a custom Options.Owner, waits for the expiry.
func ownerGone(owner string) bool {
	host, rest, ok := strings.Cut(owner, ":")
	if !ok {
		return false
	}
	spid, _, ok := strings.Cut(rest, ":")
	if !ok {
		return false
	}
	pid, err := strconv.Atoi(spid)
	if err != nil || pid <= 0 || pid == os.Getpid() {
		return false
	}
	if h, err := os.Hostname(); err != nil || h != host {
		return false
	}
	return !pidAlive(pid)
}

// acquire takes the lease for owner/jobID if it is free, expired, or its owner is gone.
func (lf leaseFile) acquire(owner, jobID string, ttl time.Duration) error {
	return lf.locked(func() error {
		cur, err := lf.read()
		if err != nil {
			return err
		}
		now := time.Now()
		if cur.heldAt(now) && !ownerGone(cur.Owner) {
			return fmt.Errorf("held by %s (job %s) until %s: %w", cur.Owner, cur.JobID,
				cur.Expires.UTC().Format(time.RFC3339), ErrLocked)
		}
		return writeJSONAtomic(lf.path(), &lease{Owner: owner, JobID: jobID, Acquired: now, Expires: now.Add(ttl)})
	})
}

// renew pushes the expiry out; it fails with ErrLocked if the lease is no longer ours.
func (lf leaseFile) renew(owner, jobID string, ttl time.Duration) error {
	return lf.locked(func() error {
		cur, err := lf.read()
		if err != nil {
			return err
		}
		if cur == nil || cur.Owner != owner || cur.JobID != jobID {
			return fmt.Errorf("lease lost: %w", ErrLocked)
		}
		cur.Expires = time.Now().Add(ttl)
		return writeJSONAtomic(lf.path(), cur)
	})
}

// release removes the lease if it is still ours.
func (lf leaseFile) release(owner, jobID string) error {
	return lf.locked(func() error {
		cur, err := lf.read()
		if err != nil {
			return err
		}
		if cur == nil || cur.Owner != owner || cur.JobID != jobID {
			return nil
		}
		if err := os.Remove(lf.path()); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("release lease: %w", err)
		}
		return nil
	})
}

// current returns the lease if one is held now, else nil.
func (lf leaseFile) current() (*lease, error) {
	var l *lease
	err := lf.locked(func() error {
		cur, err := lf.read()
		if err != nil {
			return err
		}
		if cur.heldAt(time.Now()) {
			l = cur
		}
		return nil
	})
	return l, err
}

// writeJSONAtomic replaces path by v as JSON (mode 0600; internal/atomicfile: a synced temporary
// file renamed over it, then the directory synced).
func writeJSONAtomic(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", filepath.Base(path), err)
	}
	return atomicfile.WriteFile(path, b, 0o600)
}
