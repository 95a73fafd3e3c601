package example

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/provider/plugin"
)

// Tags and garbage collection (capability "resources", provider.ResourceManager): a cloud tags
// its instances and lists them by tag; here every machine has a record beside its disk,
// <Dir>/machines/<stack>/<label>.json, written when the boot starts (before anything of the
// machine exists) and removed last when it is destroyed. The stack and label are where the
// record is, never what it says: a record cannot point the provider at another machine's disk.

// KindMachine is the kind of the example's resources.
const KindMachine = "example-machine"

// recordMax bounds a record file: anything bigger is not one of the provider's.
const recordMax = 64 << 10

// record is what the provider keeps about one machine.
type record struct {
	// ID is the machine resource's id in Terraform's state (the terraform_data's), which the
	// boot's request names: kloud's garbage collector compares it with the stack's state.
	ID       string    `json:"id"`
	Machine  string    `json:"machine"` // kloud's machine id
	Team     string    `json:"team,omitempty"`
	Owner    string    `json:"owner"`
	Hostname string    `json:"hostname,omitempty"`
	Instance string    `json:"instance"` // the kloud instance (Options.Instance)
	Created  time.Time `json:"created"`
	Complete bool      `json:"complete"` // the boot finished
	// Off: the machine was stopped (Stop) and stays off until Start; Resume leaves it off.
	Off bool `json:"off,omitempty"`
}

// resourceIDRe is what a machine resource's id in Terraform's state looks like (terraform_data
// ids are UUIDs).
var resourceIDRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9-]{0,63}$`)

func (e *example) recordPath(stackID, label string) string { return e.dir(stackID, label) + ".json" }

// writeRecord writes machine label's record (aside, then renamed into place).
func (e *example) writeRecord(stackID, label string, r record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	path := e.recordPath(stackID, label)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("record: %w", err)
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".record-*")
	if err != nil {
		return fmt.Errorf("record: %w", err)
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("record: %w", err)
	}
	return nil
}

// readRecord reads machine label's record: a regular file (not a link), at most recordMax bytes.
func (e *example) readRecord(stackID, label string) (*record, error) {
	path := e.recordPath(stackID, label)
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return nil, fmt.Errorf("record %s: not a regular file", path)
	}
	b, err := io.ReadAll(io.LimitReader(f, recordMax+1))
	if err != nil {
		return nil, fmt.Errorf("record %s: %w", path, err)
	}
	var r record
	if len(b) > recordMax || json.Unmarshal(b, &r) != nil {
		return nil, fmt.Errorf("record %s: not a machine record", path)
	}
	return &r, nil
}

// removeRecord removes machine label's record; one that is not there is no error.
func (e *example) removeRecord(stackID, label string) error {
	if err := os.Remove(e.recordPath(stackID, label)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("record: %w", err)
	}
	return nil
}

// placed is a record and where it is.
type placed struct {
	stack, label string
	rec          *record
}

// records lists the machine records of stack (every stack if ""), skipping what is not a valid
// record (logged).
func (e *example) records(stack string) ([]placed, error) {
	stacks := []string{stack}
	if stack == "" {
		entries, err := os.ReadDir(filepath.Join(e.o.Dir, "machines"))
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		stacks = stacks[:0]
		for _, en := range entries {
			if en.IsDir() && plugin.ValidName(en.Name()) { // a symlink is no stack directory
				stacks = append(stacks, en.Name())
			}
		}
	}
	var out []placed
	for _, st := range stacks {
		entries, err := os.ReadDir(filepath.Join(e.o.Dir, "machines", st))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		for _, en := range entries {
			label, ok := strings.CutSuffix(en.Name(), ".json")
			if !ok || !en.Type().IsRegular() || !plugin.ValidName(label) {
				continue
			}
			r, err := e.readRecord(st, label)
			if errors.Is(err, fs.ErrNotExist) {
				continue // destroyed meanwhile
			}
			if err != nil {
				e.o.Logger.Warn("machine record: skipped", "stack", st, "machine", label, "err", err)
				continue
			}
			out = append(out, placed{st, label, r})
		}
	}
	return out, nil
}

// instanceID returns Options.Instance or the instance id kept in Dir/instance-id (made once).
func (e *example) instanceID() (string, error) {
	e.keyMu.Lock()
	defer e.keyMu.Unlock()
	if e.instance != "" {
		return e.instance, nil
	}
	id := e.o.Instance
	if id == "" {
		b := make([]byte, 8)
		rand.Read(b)
		kept, err := e.kept("instance-id", []byte("example-"+hex.EncodeToString(b)+"\n"))
		if err != nil {
			return "", fmt.Errorf("example: instance id: %w", err)
		}
		id = strings.TrimSpace(string(kept))
	}
	if !plugin.ValidName(id) {
		return "", fmt.Errorf("example: instance id %q: want 1-128 letters, digits, dots, dashes and underscores", id)
	}
	e.instance = id
	return id, nil
}

// inventory is the example's provider.ResourceManager (Provider.Inventory).
type inventory struct{ e *example }

// Resources lists this instance's machines from their records: id as Terraform's state has it,
// kloud's tags, the time the boot started; a machine whose boot never finished (the provider
// died midway) is Incomplete.
func (i inventory) Resources(ctx context.Context) ([]provider.Resource, error) {
	inst, err := i.e.instanceID()
	if err != nil {
		return nil, err
	}
	recs, err := i.e.records("")
	if err != nil {
		return nil, fmt.Errorf("example: machine records: %w", err)
	}
	out := []provider.Resource{}
	for _, p := range recs {
		if p.rec.Instance != inst {
			continue
		}
		out = append(out, provider.Resource{
			ID: p.rec.ID, Kind: KindMachine, Name: p.rec.Hostname, CreatedAt: p.rec.Created, Incomplete: !p.rec.Complete,
			Tags: provider.ResourceTags(p.stack, p.rec.Team, p.rec.Owner, p.rec.Machine, p.rec.Instance),
		})
	}
	return out, nil
}

// RemoveResource destroys machine r (as Resources listed it): its processes, its disk, its
// record. It refuses one whose record now says another machine or instance; one already gone is
// no error.
func (i inventory) RemoveResource(ctx context.Context, r provider.Resource) error {
	e := i.e
	stack := r.Tag(provider.TagStack)
	if r.Kind != KindMachine || !plugin.ValidName(stack) || !resourceIDRe.MatchString(r.ID) {
		return fmt.Errorf("example: %s of stack %q is not a machine of this provider", r, stack)
	}
	inst, err := e.instanceID()
	if err != nil {
		return err
	}
	recs, err := e.records(stack)
	if err != nil {
		return fmt.Errorf("example: machine records: %w", err)
	}
	for _, p := range recs {
		if p.rec.ID != r.ID {
			continue
		}
		// Checked again under the machine's lock: a boot may have replaced it meanwhile.
		return e.destroy(ctx, p.stack, p.label, func(rec *record) error {
			switch {
			case rec == nil || rec.ID != r.ID:
				return fmt.Errorf("example: machine %s/%s was replaced since it was listed: not removed (list again)", p.stack, p.label)
			case rec.Instance != inst:
				return fmt.Errorf("example: machine %s/%s belongs to kloud instance %q, not this one: not removed", p.stack, p.label, rec.Instance)
			case rec.Machine != r.Tag(provider.TagMachine):
				return fmt.Errorf("example: machine %s/%s is now tagged for machine %q, not %q as listed: not removed (list again)", p.stack, p.label, rec.Machine, r.Tag(provider.TagMachine))
			}
			return nil
		})
	}
	return nil
}

var _ provider.ResourceManager = inventory{}

// setOff records in machine label's record whether it is meant to be off (Resume). A machine
// without a record (made before records, or being destroyed) has nothing to record.
func (e *example) setOff(stackID, label string, off bool) error {
	r, err := e.readRecord(stackID, label)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if r.Off == off {
		return nil
	}
	r.Off = off
	return e.writeRecord(stackID, label, *r)
}
