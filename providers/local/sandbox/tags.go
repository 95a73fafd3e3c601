package sandbox

import (
	"context"
	"maps"
)

// SetTags replaces the machine's tags (kept in machine.json, returned by Info and seen by GC's
// keep function). It works on running and stopped machines alike and changes nothing else.
func (m *Manager) SetTags(ctx context.Context, id string, tags map[string]string) (Info, error) {
	l, r, err := m.lockRecord(ctx, id, "set tags of machine")
	if err != nil {
		return Info{}, err
	}
	defer l.unlock()
	r.Tags = maps.Clone(tags)
	if len(r.Tags) == 0 {
		r.Tags = nil
	}
	if err := m.saveRecord(r); err != nil {
		return Info{}, err
	}
	return m.info(r), nil
}
