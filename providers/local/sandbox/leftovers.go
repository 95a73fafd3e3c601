package sandbox

// Leftovers: what a machine leaves on the host once its record (machine.json) is gone — its
// network namespace (a mount in /run/netns), host veth, cgroups, and a machine directory without
// a readable record (with any host mounts below it). A destroy that failed half-way (it removes
// the directory even when the namespace refused to go), a crash inside the directory's removal,
// or a state dir restored from a backup leave them. The manager's startup GC removed them;
// Leftovers lists them, with the machine they belonged to, so a caller that runs periodically
// (kloud's garbage collector, through the local provider's Inventory) can too.
//
// To know whose leftovers they are after machine.json is gone, every machine has a ledger
// entry (state dir .ledger/ID.json: its id, hostname, instance, tags and creation time), written
// before anything of the machine exists and removed by Destroy only once everything else is.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kloud-dev/kloud/internal/cgroups"
)

// ledgerDir is the state dir's directory of ledger entries.
const ledgerDir = ".ledger"

// ledgerEntry is .ledger/ID.json.
type ledgerEntry struct {
	ID        string            `json:"id"`
	Hostname  string            `json:"hostname,omitempty"`
	Instance  string            `json:"instance,omitempty"`
	Tags      map[string]string `json:"tags,omitempty"`
	CreatedAt time.Time         `json:"created_at"`
}

func (m *Manager) ledgerPath(id string) string {
	return filepath.Join(m.stateDir, ledgerDir, id+".json")
}

// saveLedger writes r's ledger entry atomically: reserve before anything of the machine exists,
// saveIdentity when its tags or instance change.
func (m *Manager) saveLedger(r *record) error {
	b, err := json.Marshal(ledgerEntry{ID: r.ID, Hostname: r.Hostname, Instance: r.Instance, Tags: r.Tags, CreatedAt: r.CreatedAt})
	if err != nil {
		return fmt.Errorf("encode ledger entry: %w", err)
	}
	p := m.ledgerPath(r.ID)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	if err := replaceFile(p, b); err != nil {
		return fmt.Errorf("write ledger entry: %w", err)
	}
	return nil
}

// loadLedger reads every ledger entry, by machine id; unreadable ones are skipped.
func (m *Manager) loadLedger() map[string]ledgerEntry {
	out := map[string]ledgerEntry{}
	ents, _ := os.ReadDir(filepath.Join(m.stateDir, ledgerDir))
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || validID(id) != nil {
			continue
		}
		b, err := os.ReadFile(m.ledgerPath(id))
		var le ledgerEntry
		if err != nil || json.Unmarshal(b, &le) != nil || le.ID != id {
			continue
		}
		out[id] = le
	}
	return out
}

// Leftover is what one machine left on the host without a record: empty fields are parts that
// are not there. ID, Hostname, Instance, Tags and CreatedAt come from the machine's ledger entry
// (ID also from a directory without a record); they are empty when neither is there (leftovers
// of machines made before the ledger existed, or of another state dir's manager with our hash).
type Leftover struct {
	ID        string            `json:"id,omitempty"`
	Hostname  string            `json:"hostname,omitempty"`
	Instance  string            `json:"instance,omitempty"`
	Tags      map[string]string `json:"tags,omitempty"`
	CreatedAt time.Time         `json:"createdAt,omitzero"`
	Netns     string            `json:"netns,omitempty"`
	HostVeth  string            `json:"hostVeth,omitempty"`
	Cgroup    string            `json:"cgroup,omitempty"`
	Dir       string            `json:"dir,omitempty"`    // a machine directory without a readable record
	Mounts    []string          `json:"mounts,omitempty"` // host mounts at or below Dir
	Ledger    bool              `json:"ledger,omitempty"` // the ledger entry itself is still there

	mid string // the names' hash part
}

// Parts names what is left, for messages: "netns kd-…, veth kdh…, cgroup kloud/kd-…".
func (lo Leftover) Parts() string {
	var p []string
	for _, kv := range [][2]string{{"netns", lo.Netns}, {"veth", lo.HostVeth}, {"cgroup", lo.Cgroup}, {"dir", lo.Dir}} {
		if kv[1] != "" {
			p = append(p, kv[0]+" "+kv[1])
		}
	}
	if len(lo.Mounts) > 0 {
		p = append(p, "mounts "+strings.Join(lo.Mounts, " "))
	}
	if len(p) == 0 && lo.Ledger {
		p = append(p, "ledger entry")
	}
	return strings.Join(p, ", ")
}

// midOf returns the hash part of a machine's names.
func (m *Manager) midOf(id string) string {
	return strings.TrimPrefix(m.namesFor(id).hostVeth, "kdh")
}

// Leftovers lists what machines of this state dir left on the host without a record (see the
// file comment), one Leftover a machine. It changes nothing, except that a machine with a record
// but no ledger entry (made before the ledger) gets one.
func (m *Manager) Leftovers(ctx context.Context) ([]Leftover, error) {
	g, err := m.lockGlobal(ctx) // Create writes a machine's record under it before any name exists
	if err != nil {
		return nil, err
	}
	defer g.unlock()
	return m.leftoversLocked()
}

func (m *Manager) leftoversLocked() ([]Leftover, error) {
	ids, err := m.machineIDs()
	if err != nil {
		return nil, err
	}
	ledger := m.loadLedger()
	owned := map[string]bool{}
	byMid := map[string]*Leftover{}
	get := func(mid string) *Leftover {
		if lo, ok := byMid[mid]; ok {
			return lo
		}
		lo := &Leftover{mid: mid}
		byMid[mid] = lo
		return lo
	}
	for _, id := range ids {
		r, err := m.loadRecord(id)
		if err == nil {
			n := m.namesFor(id)
			owned[n.netns], owned[n.hostVeth], owned[n.cgroup] = true, true, true
			owned[r.Netns], owned[r.HostVeth], owned[r.Cgroup] = true, true, true
			if _, ok := ledger[id]; !ok {
				if err := m.saveLedger(r); err != nil {
					m.log.Warn("ledger entry of a machine made before the ledger", "machine", id, "err", err)
				}
			}
			delete(ledger, id)
			continue
		}
		lo := get(m.midOf(id))
		lo.ID, lo.Dir = id, m.machineDir(id)
		lo.Mounts, _ = mountsUnder(lo.Dir)
	}
	// A ledger entry without a record: its names may be anywhere (a veth not yet on the bridge).
	for id, le := range ledger {
		n := m.namesFor(id)
		lo := get(m.midOf(id))
		lo.ID, lo.Hostname, lo.Instance, lo.Tags, lo.CreatedAt, lo.Ledger = id, le.Hostname, le.Instance, maps.Clone(le.Tags), le.CreatedAt, true
		if isNsfs(filepath.Join(netnsDir, n.netns)) || fileExists(filepath.Join(netnsDir, n.netns)) {
			lo.Netns = n.netns
		}
		if linkExists(n.hostVeth) {
			lo.HostVeth = n.hostVeth
		}
		if cgroupExists(n.cgroup) {
			lo.Cgroup = n.cgroup
		}
	}
	for _, port := range m.bridgePorts() {
		if !owned[port] && validVeth(port) {
			get(strings.TrimPrefix(port, "kdh")).HostVeth = port
		}
	}
	prefix := "kd-" + m.mgrHash + "-"
	for _, ns := range m.netnsNames() {
		if !owned[ns] {
			get(strings.TrimPrefix(ns, prefix)).Netns = ns
		}
	}
	for _, cg := range cgroupOrphans(prefix) {
		if !owned[cg] {
			get(strings.TrimPrefix(cg, "kloud/"+prefix)).Cgroup = cg
		}
	}
	out := make([]Leftover, 0, len(byMid))
	for _, mid := range slices.Sorted(maps.Keys(byMid)) { // by the names' hash part
		out = append(out, *byMid[mid])
	}
	return out, nil
}

// RemoveLeftover removes what lo (as Leftovers listed it) names: for a known machine id, after
// checking under the machine's lock that it still has no record, everything Destroy removes
// (processes, cgroups, namespace, veth, directory, ledger entry); without an id, the namespace,
// veth and cgroups, after checking under the global lock that no record owns them. Parts already
// gone are no error; a machine that has a record again is refused.
func (m *Manager) RemoveLeftover(ctx context.Context, lo Leftover) error {
	if lo.ID != "" {
		if err := validID(lo.ID); err != nil {
			return err
		}
		l, err := m.lockMachine(ctx, lo.ID)
		if err != nil {
			return err
		}
		defer l.unlock()
		if _, err := m.loadRecord(lo.ID); err == nil {
			return fmt.Errorf("machine %q has a record again: not a leftover (list again)", lo.ID)
		}
		l.remove = true
		m.log.Info("removing leftovers of a machine without a record", "machine", lo.ID, "parts", lo.Parts())
		return m.destroyLocked(ctx, lo.ID)
	}
	n := names{netns: lo.Netns, hostVeth: lo.HostVeth, cgroup: lo.Cgroup}
	if (n.netns != "" && (!validNetns(n.netns) || !strings.HasPrefix(n.netns, "kd-"+m.mgrHash+"-"))) ||
		(n.hostVeth != "" && !validVeth(n.hostVeth)) || (n.cgroup != "" && !validMachineCgroup(n.cgroup)) {
		return fmt.Errorf("leftover %s: not this manager's names", lo.Parts())
	}
	g, err := m.lockGlobal(ctx)
	if err != nil {
		return err
	}
	defer g.unlock()
	now, err := m.leftoversLocked()
	if err != nil {
		return err
	}
	i := slices.IndexFunc(now, func(x Leftover) bool { return x.ID == "" && x.mid == lo.mid })
	if i < 0 && lo.mid == "" { // lo made by hand: find it by its names
		i = slices.IndexFunc(now, func(x Leftover) bool {
			return x.ID == "" && ((n.netns != "" && x.Netns == n.netns) || (n.hostVeth != "" && x.HostVeth == n.hostVeth) || (n.cgroup != "" && x.Cgroup == n.cgroup))
		})
	}
	if i < 0 {
		return nil // gone, or owned by a record now
	}
	return m.removeUnownedLocked(ctx, now[i])
}

// removeUnownedLocked removes the processes, cgroups, namespace and veth of cur, a leftover
// without an id that leftoversLocked listed under the global lock the caller still holds.
func (m *Manager) removeUnownedLocked(ctx context.Context, cur Leftover) error {
	m.log.Info("removing leftovers no machine owns", "parts", cur.Parts())
	cn := names{netns: cur.Netns, hostVeth: cur.HostVeth, cgroup: cur.Cgroup}
	var errs []error
	errs = append(errs, killLeftovers(ctx, cn))
	if cn.cgroup != "" {
		errs = append(errs, removeCgroups(cn.cgroup))
	}
	errs = append(errs, m.removeMachineNetwork(ctx, cn))
	return errors.Join(errs...)
}

// removeAllLeftovers removes every leftover (GC's last step) with one scan: the ones without an
// id at once under the global lock the scan took, then the ones of a known machine through
// RemoveLeftover (it takes that machine's lock, which goes before the global one).
func (m *Manager) removeAllLeftovers(ctx context.Context) error {
	g, err := m.lockGlobal(ctx)
	if err != nil {
		return err
	}
	los, err := m.leftoversLocked()
	if err != nil {
		g.unlock()
		return err
	}
	var errs []error
	var known []Leftover
	for _, lo := range los {
		if lo.ID == "" {
			errs = append(errs, m.removeUnownedLocked(ctx, lo))
		} else {
			known = append(known, lo)
		}
	}
	g.unlock()
	for _, lo := range known {
		errs = append(errs, m.RemoveLeftover(ctx, lo))
	}
	return errors.Join(errs...)
}

// removeLedger deletes id's ledger entry (Destroy's last step).
func (m *Manager) removeLedger(id string) error {
	if err := os.Remove(m.ledgerPath(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove ledger entry: %w", err)
	}
	return nil
}

func fileExists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

// cgroupExists says whether the machine cgroup rel exists in any hierarchy.
func cgroupExists(rel string) bool {
	if !validMachineCgroup(rel) {
		return false
	}
	hs, err := cgroups.Hierarchies()
	if err != nil {
		return false
	}
	for _, d := range cgroupDirs(hs, rel) {
		if fileExists(d) {
			return true
		}
	}
	return false
}
