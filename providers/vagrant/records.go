package vagrant

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// record is what kloud keeps of a vagrant machine it asked a host to create
// (<state dir>/machines/<name>.json): whose it is and where it lives. The host keeps the machine;
// the record says which stack and kloud instance may touch it.
type record struct {
	Name     string            `json:"name"`
	Host     string            `json:"host"`
	Owner    string            `json:"owner"`
	Instance string            `json:"instance"`
	Hostname string            `json:"hostname"`
	Image    string            `json:"image,omitempty"`
	Box      string            `json:"box,omitempty"`
	Provider string            `json:"provider,omitempty"`
	MemoryMB int64             `json:"memoryMB,omitempty"`
	CPUs     int64             `json:"cpus,omitempty"`
	Tags     map[string]string `json:"tags"`
	// Complete is set once the host made and booted the machine and the service answered; a
	// record without it whose create is not running in this process is what a crash left
	// (kloud died mid-create, so terraform never learnt the machine): the inventory lists it
	// Incomplete and kloud's gc removes it (it is in no stack's Terraform state).
	Complete bool `json:"complete,omitempty"`
}

func (v *Vagrant) recordPath(name string) string {
	return filepath.Join(v.stateDir, "machines", name+".json")
}

// readRecord returns the machine's record, or fs.ErrNotExist.
func (v *Vagrant) readRecord(name string) (*record, error) {
	if !machineNameRE.MatchString(name) {
		return nil, fmt.Errorf("machine %q: %w", name, fs.ErrNotExist)
	}
	b, err := os.ReadFile(v.recordPath(name))
	if err != nil {
		return nil, err
	}
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("record of vagrant machine %s: %w", name, err)
	}
	return &r, nil
}

func (v *Vagrant) writeRecord(r *record) error {
	v.recMu.Lock()
	defer v.recMu.Unlock()
	if err := os.MkdirAll(filepath.Join(v.stateDir, "machines"), 0o700); err != nil {
		return err
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	tmp := v.recordPath(r.Name) + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, v.recordPath(r.Name))
}

func (v *Vagrant) removeRecord(name string) error {
	err := os.Remove(v.recordPath(name))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

// records lists every machine record, sorted by name.
func (v *Vagrant) records() ([]*record, error) {
	ents, err := os.ReadDir(filepath.Join(v.stateDir, "machines"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []*record
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok {
			continue
		}
		r, err := v.readRecord(name)
		if err != nil {
			continue
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// inflight reports whether a create of machine name runs in this process.
func (v *Vagrant) inflight(name string) bool {
	v.recMu.Lock()
	defer v.recMu.Unlock()
	return v.creating[name]
}

func (v *Vagrant) setInflight(name string, on bool) {
	v.recMu.Lock()
	defer v.recMu.Unlock()
	if on {
		v.creating[name] = true
	} else {
		delete(v.creating, name)
	}
}
