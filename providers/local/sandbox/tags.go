package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
)

// SetTags replaces the machine's tags (kept in machine.json, returned by Info and seen by GC's
// keep function). It works on running and stopped machines alike and changes nothing else.
func (m *Manager) SetTags(ctx context.Context, id string, tags map[string]string) (Info, error) {
	if err := validID(id); err != nil {
		return Info{}, err
	}
	l, err := m.lockMachine(ctx, id)
	if err != nil {
		return Info{}, err
	}
	defer l.unlock()
	r, err := m.loadRecord(id)
	if errors.Is(err, fs.ErrNotExist) {
		return Info{}, fmt.Errorf("set tags of machine %q: %w", id, ErrNotFound)
	}
	if err != nil {
		return Info{}, err
	}
	r.Tags = maps.Clone(tags)
	if len(r.Tags) == 0 {
		r.Tags = nil
	}
	if err := m.saveRecord(r); err != nil {
		return Info{}, err
	}
	return m.info(r), nil
}
