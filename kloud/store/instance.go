package store

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Instance and process: the holder of a job's runner lease (Job.Runner) or of a named lease
// (Lease.Holder) is a process, named "<instance>.<boot>" (Store.InstanceID). The instance id is
// persisted in DataDir/instance.id, which the process holds locked (flock) while its store is
// open; the boot id is new at every Open. So a kloud restarted on the same data directory is
// the same instance in a new process: a lease held by an earlier process of its own instance
// is dead (only one process holds the data directory), and Jobs.Start, Jobs.Orphans,
// AcquireLease and LeaseHolder treat it as expired at once, instead of waiting out its TTL.
// Another instance (a replica sharing a MongoDB) still waits for the expiry. Without a DataDir,
// or when its instance.id cannot be locked (another process has it open), the instance id is
// random and nothing is taken early.

// InstanceFile is the file in the data directory that holds the instance id.
const InstanceFile = "instance.id"

var instanceIDRE = regexp.MustCompile(`^[0-9a-f]{24}$`)

// claimInstance reads (creating it if missing or damaged) dataDir's instance id and locks its
// file for this process; release unlocks it. An error: the id is not usable (e.g. another
// process holds the file locked, or it cannot be written), and the caller picks a random one.
func claimInstance(dataDir string) (id string, release func(), err error) {
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return "", nil, fmt.Errorf("instance id: %w", err)
	}
	path := filepath.Join(dataDir, InstanceFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return "", nil, fmt.Errorf("instance id: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return "", nil, fmt.Errorf("instance id %s: in use by another process", path)
		}
		return "", nil, fmt.Errorf("instance id %s: lock: %w", path, err)
	}
	release = func() { f.Close() } // closing the file drops the lock
	buf := make([]byte, 64)
	n, _ := f.ReadAt(buf, 0)
	id = strings.TrimSpace(string(buf[:n]))
	if !instanceIDRE.MatchString(id) {
		id = NewID()
		// The id is written in place (the file is the lock, so it is not replaced); a torn
		// write reads as damaged next time and a new id is chosen, which only costs one
		// restart the early takeover.
		if err := f.Truncate(0); err == nil {
			_, err = f.WriteAt([]byte(id+"\n"), 0)
			if err == nil {
				err = f.Sync()
			}
			if err != nil {
				release()
				return "", nil, fmt.Errorf("instance id %s: %w", path, err)
			}
		} else {
			release()
			return "", nil, fmt.Errorf("instance id %s: %w", path, err)
		}
	}
	return id, release, nil
}

// EarlierProcess reports whether id (a lease holder, a job runner, a replica id: an
// InstanceID) is an earlier process of this store's instance, so it is dead (see above): kloud
// restarted on the same data directory.
func (s *Store) EarlierProcess(id string) bool {
	return id != "" && id != s.instance && strings.HasPrefix(id, s.instancePrefix)
}

// deadHolderFilter is EarlierProcess as a query condition on field.
func (s *Store) deadHolderFilter(field string) bson.M {
	return bson.M{field: bson.M{"$regex": "^" + regexp.QuoteMeta(s.instancePrefix), "$ne": s.instance}}
}
