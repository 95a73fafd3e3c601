package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"golang.org/x/sys/unix"
)

// recordVersion is bumped when machine.json changes incompatibly.
const recordVersion = 1

// record is machine.json: everything needed to find and remove what belongs to a machine, written
// before any of it is created, plus the identity of the running PID 1.
type record struct {
	Version   int               `json:"version"`
	ID        string            `json:"id"`
	Hostname  string            `json:"hostname"`
	Tags      map[string]string `json:"tags,omitempty"`
	Instance  string            `json:"instance,omitempty"`
	MemoryMB  int               `json:"memory_mb,omitempty"`
	DiskMB    int               `json:"disk_mb,omitempty"` // disk quota: the upper dir is in disk.img
	CPUs      float64           `json:"cpus,omitempty"`
	PidsMax   int               `json:"pids_max,omitempty"` // -1: no limit; 0 (records before it): DefaultPidsMax
	SeedURL   string            `json:"seed_url,omitempty"`
	CreatedAt time.Time         `json:"created_at"`
	// Complete is set once Create returned successfully; GC removes records without it.
	Complete bool `json:"complete"`

	// Pinned at create time: the overlay upper dir is only valid over the lower it was made on.
	BaseImage string     `json:"base_image"`
	IP        netip.Addr `json:"ip"`
	PrefixLen int        `json:"prefix_len"`
	Bridge    string     `json:"bridge"`
	Netns     string     `json:"netns"`
	HostVeth  string     `json:"host_veth"`
	PeerVeth  string     `json:"peer_veth"`
	Cgroup    string     `json:"cgroup"` // relative to each hierarchy, e.g. "kloud/kd-0a1b2c-0123456789"

	// Runtime: the machine's PID 1 as seen from the host, with its start time (clock ticks since
	// boot, field 22 of /proc/PID/stat) so a reused PID is never mistaken for the machine.
	PID      int       `json:"pid,omitempty"`
	PIDStart uint64    `json:"pid_start,omitempty"`
	BootedAt time.Time `json:"booted_at,omitzero"`
}

var idRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

func validID(id string) error {
	if !idRE.MatchString(id) {
		return fmt.Errorf("machine id %q: want 1-64 characters of [A-Za-z0-9._-], not starting with . _ or -", id)
	}
	return nil
}

// names are the host-side names of one machine's resources. They are derived from a hash of the
// state dir and the id, so two managers (a demo and a test run) never collide, and Destroy can
// find them even when machine.json was never written.
type names struct {
	netns, hostVeth, peerVeth, cgroup string
}

func (m *Manager) namesFor(id string) names {
	h := sha256.Sum256([]byte(m.stateDir + "\x00" + id))
	mid := hex.EncodeToString(h[:])[:10]
	ns := "kd-" + m.mgrHash + "-" + mid
	return names{
		netns:    ns,
		hostVeth: "kdh" + mid, // 13 chars: interface names are limited to 15
		peerVeth: "kdp" + mid,
		cgroup:   "kloud/" + ns,
	}
}

func (m *Manager) machineDir(id string) string { return filepath.Join(m.stateDir, id) }

func (m *Manager) recordPath(id string) string {
	return filepath.Join(m.machineDir(id), "machine.json")
}

// loadRecord reads machine.json; a missing file is fs.ErrNotExist.
func (m *Manager) loadRecord(id string) (*record, error) {
	b, err := os.ReadFile(m.recordPath(id))
	if err != nil {
		return nil, err
	}
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("machine %q: parse machine.json: %w", id, err)
	}
	if r.Version != recordVersion {
		return nil, fmt.Errorf("machine %q: machine.json version %d, want %d", id, r.Version, recordVersion)
	}
	return &r, nil
}

// saveRecord writes machine.json atomically (temp file + rename), so readers never lock. It
// leaves the ledger entry alone: the entry holds only what reserve writes and SetTags and
// SetInstance change (saveIdentity).
func (m *Manager) saveRecord(r *record) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("encode machine.json: %w", err)
	}
	if err := replaceFile(m.recordPath(r.ID), append(b, '\n')); err != nil {
		return fmt.Errorf("write machine.json: %w", err)
	}
	return nil
}

// saveIdentity saves a record whose tags or instance changed: the ledger entry first (leftovers.go:
// who the machine was, if machine.json goes), then machine.json.
func (m *Manager) saveIdentity(r *record) error {
	if err := m.saveLedger(r); err != nil {
		return err
	}
	return m.saveRecord(r)
}

// replaceFile writes p through p.tmp and a rename (mode 0600), so readers see the old or the new
// content, never a part.
func replaceFile(p string, b []byte) error {
	if err := os.WriteFile(p+".tmp", b, 0o600); err != nil {
		return err
	}
	return os.Rename(p+".tmp", p)
}

// fileLock is an exclusive flock on a file. Locks order: a machine's lock before the global lock.
type fileLock struct {
	f      *os.File
	path   string
	remove bool
}

// lockPath takes an exclusive flock on path, creating it, polling so ctx can cancel the wait. A
// lock file that was unlinked while we waited (Destroy removes a machine's lock file) is retried,
// so two holders never hold locks on different inodes of the same path.
func lockPath(ctx context.Context, path string) (*fileLock, error) {
	delay := 5 * time.Millisecond
	for {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, fmt.Errorf("open lock: %w", err)
		}
		for {
			err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
			if err == nil {
				break
			}
			if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
				f.Close()
				return nil, fmt.Errorf("flock %s: %w", path, err)
			}
			select {
			case <-ctx.Done():
				f.Close()
				return nil, fmt.Errorf("wait for lock %s: %w", path, ctx.Err())
			case <-time.After(delay):
			}
			delay = min(delay*2, 100*time.Millisecond)
		}
		var held, onDisk unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &held); err != nil {
			f.Close()
			return nil, fmt.Errorf("stat lock: %w", err)
		}
		if err := unix.Stat(path, &onDisk); err == nil && onDisk.Ino == held.Ino && onDisk.Dev == held.Dev {
			return &fileLock{f: f, path: path}, nil
		}
		f.Close() // removed or replaced while we waited: lock the new file
	}
}

// unlock releases the lock, first unlinking the file if removeOnUnlock was called.
func (l *fileLock) unlock() {
	if l == nil || l.f == nil {
		return
	}
	if l.remove {
		os.Remove(l.path)
	}
	l.f.Close()
	l.f = nil
}

func (m *Manager) lockGlobal(ctx context.Context) (*fileLock, error) {
	return lockPath(ctx, filepath.Join(m.stateDir, ".lock"))
}

// lockRecord validates id, takes the machine's lock and loads its record; op names the
// operation in the not-found error ("start machine"). The caller unlocks.
func (m *Manager) lockRecord(ctx context.Context, id, op string) (*fileLock, *record, error) {
	if err := validID(id); err != nil {
		return nil, nil, err
	}
	l, err := m.lockMachine(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	r, err := m.loadRecord(id)
	if errors.Is(err, fs.ErrNotExist) {
		err = fmt.Errorf("%s %q: %w", op, id, ErrNotFound)
	}
	if err != nil {
		l.unlock()
		return nil, nil, err
	}
	return l, r, nil
}

func (m *Manager) lockMachine(ctx context.Context, id string) (*fileLock, error) {
	return lockPath(ctx, filepath.Join(m.stateDir, ".locks", id+".lock"))
}

// machineIDs lists the ids that have a directory in the state dir (complete, half-created or
// broken alike).
func (m *Manager) machineIDs() ([]string, error) {
	ents, err := os.ReadDir(m.stateDir)
	if err != nil {
		return nil, fmt.Errorf("read state dir: %w", err)
	}
	var ids []string
	for _, e := range ents {
		if e.IsDir() && validID(e.Name()) == nil {
			ids = append(ids, e.Name())
		}
	}
	return ids, nil
}

// allocateIP picks the lowest free address of the subnet (.2 and up). Call with the global lock
// held, and write the record before releasing it.
func (m *Manager) allocateIP() (netip.Addr, error) {
	used := map[netip.Addr]bool{}
	ids, err := m.machineIDs()
	if err != nil {
		return netip.Addr{}, err
	}
	for _, id := range ids {
		r, err := m.loadRecord(id)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return netip.Addr{}, err
		}
		used[r.IP] = true
	}
	for a := m.hostAddr.Next(); m.subnet.Contains(a); a = a.Next() {
		if !m.subnet.Contains(a.Next()) { // broadcast address
			break
		}
		if !used[a] {
			return a, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("subnet %s: no free address", m.subnet)
}
