package sandbox

import "context"

// CreateHalf does what a Create that crashed just before booting leaves behind: the record (not
// complete), the disk, the network namespace, the veth and the cgroups.
func CreateHalf(ctx context.Context, m *Manager, spec Spec) error {
	if spec.Hostname == "" {
		spec.Hostname = spec.ID
	}
	l, err := m.lockMachine(ctx, spec.ID)
	if err != nil {
		return err
	}
	defer l.unlock()
	r, err := m.reserve(ctx, spec)
	if err != nil {
		return err
	}
	if err := m.prepareDisk(r, spec); err != nil {
		return err
	}
	if err := m.SetupNetwork(ctx); err != nil {
		return err
	}
	if err := m.ensureMachineNetwork(ctx, r); err != nil {
		return err
	}
	_, err = setupCgroups(r)
	return err
}

// CgroupOf returns the machine's cgroup path relative to each hierarchy.
func CgroupOf(m *Manager, id string) string { return m.namesFor(id).cgroup }
