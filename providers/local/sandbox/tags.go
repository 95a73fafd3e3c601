package sandbox

import (
	"context"
	"fmt"
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
	if err := m.saveIdentity(r); err != nil {
		return Info{}, err
	}
	if err := m.ApplyFirewall(ctx); err != nil { // the owner and team tags decide who reaches it
		return Info{}, err
	}
	return m.info(r), nil
}

// SetInstance records the owning instance of a machine that has none yet (made before instance
// ids). A machine that already has another instance is refused: owners never change.
func (m *Manager) SetInstance(ctx context.Context, id, instance string) (Info, error) {
	if !idRE.MatchString(instance) {
		return Info{}, fmt.Errorf("instance %q: want 1-64 characters of [A-Za-z0-9._-]", instance)
	}
	l, r, err := m.lockRecord(ctx, id, "set instance of machine")
	if err != nil {
		return Info{}, err
	}
	defer l.unlock()
	if r.Instance != "" && r.Instance != instance {
		return Info{}, fmt.Errorf("machine %q belongs to instance %q", id, r.Instance)
	}
	r.Instance = instance
	if err := m.saveIdentity(r); err != nil {
		return Info{}, err
	}
	return m.info(r), nil
}
