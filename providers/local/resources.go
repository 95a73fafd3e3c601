package local

import (
	"context"
	"errors"
	"fmt"

	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/local/sandbox"
)

// More tags kloud puts on every machine (besides TagStack and TagMachine, local.go): the stack's
// team and owner. The machine's kloud instance is machine.json's own field (Info.Instance).
const (
	TagTeam  = "kloud_team"
	TagOwner = "kloud_owner"
)

// tagKeys maps the tag keys of local machines (machine.json) to kloud's (provider.Tag*).
func tagKeys() map[string]string {
	return map[string]string{TagStack: provider.TagStack, TagMachine: provider.TagMachine, TagTeam: provider.TagTeam, TagOwner: provider.TagOwner}
}

// The kinds of the local provider's resources: its machines, and what a machine left on the
// host once its record was gone (sandbox.Leftover: network namespace, veth, cgroups, a directory
// without machine.json), listed as Orphan under the machine's id and tags.
const (
	KindMachine   = "machine"
	KindLeftovers = "leftovers"
)

// inventory is the local provider's provider.ResourceManager (Provider.Inventory).
type inventory struct{ l *Local }

// Resources lists this instance's machines that carry kloud's stack tag, half-created ones
// included (Incomplete), with kloud's tags (provider.Tag*), and what this instance's machines
// left on the host without a record (KindLeftovers, Orphan). Machines of other instances, or
// without an instance (made before instance ids), are not listed.
func (i inventory) Resources(ctx context.Context) ([]provider.Resource, error) {
	m, err := i.l.manager()
	if err != nil {
		return nil, err
	}
	all, err := m.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("local machines: %w", err)
	}
	var out []provider.Resource
	for _, in := range all {
		if in.Instance != i.l.instance || in.Tags[TagStack] == "" {
			continue
		}
		out = append(out, resource(in))
	}
	los, err := m.Leftovers(ctx)
	if err != nil {
		return out, fmt.Errorf("local machines' leftovers: %w", err)
	}
	for _, lo := range los {
		// Leftovers of machines of no known instance stay for kloud serve's startup tidy (they
		// may be another kloud's on a shared state dir, like such machines).
		if lo.Instance != i.l.instance {
			continue
		}
		out = append(out, leftoverResource(lo))
	}
	return out, nil
}

// leftoverResource is lo as a provider.Resource: Orphan, with the tags of the machine it was.
func leftoverResource(lo sandbox.Leftover) provider.Resource {
	tags := provider.MapTags(lo.Tags, tagKeys())
	tags[provider.TagInstance] = lo.Instance
	name := lo.Parts()
	if lo.Hostname != "" {
		name = lo.Hostname + ": " + name
	}
	return provider.Resource{ID: lo.ID, Kind: KindLeftovers, Name: name, Tags: tags, CreatedAt: lo.CreatedAt, Orphan: true}
}

// resource is machine in as a provider.Resource.
func resource(in sandbox.Info) provider.Resource {
	tags := provider.MapTags(in.Tags, tagKeys())
	if in.Instance != "" {
		tags[provider.TagInstance] = in.Instance
	}
	return provider.Resource{ID: in.ID, Kind: KindMachine, Name: in.Hostname, Tags: tags, CreatedAt: in.CreatedAt, Incomplete: !in.Complete}
}

// RemoveResource destroys local machine r.ID (processes, network, cgroups, disk), if it is
// still this instance's machine of r's stack. A machine already gone is no error.
func (i inventory) RemoveResource(ctx context.Context, r provider.Resource) error {
	m, err := i.l.manager()
	if err != nil {
		return err
	}
	if r.Kind == KindLeftovers && idRE.MatchString(r.ID) {
		return i.removeLeftovers(ctx, m, r)
	}
	if r.Kind != KindMachine || !idRE.MatchString(r.ID) {
		return fmt.Errorf("local provider: %s is not a local machine", r)
	}
	in, err := m.Info(ctx, r.ID)
	if errors.Is(err, sandbox.ErrNotFound) || (err == nil && in.State == sandbox.StateAbsent) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("local machine %s: %w", r.ID, err)
	}
	if in.Instance != i.l.instance {
		return fmt.Errorf("local machine %s belongs to kloud instance %q, not this one (%s): not removed", r.ID, in.Instance, i.l.instance)
	}
	if in.Tags[TagStack] != r.Tag(provider.TagStack) || in.Tags[TagMachine] != r.Tag(provider.TagMachine) {
		return fmt.Errorf("local machine %s is now tagged stack %q machine %q, not as listed: not removed (list again)", r.ID, in.Tags[TagStack], in.Tags[TagMachine])
	}
	if err := m.Destroy(ctx, r.ID); err != nil {
		return fmt.Errorf("destroy local machine %s: %w", r.ID, err)
	}
	i.l.log.Info("local provider: removed machine", "id", r.ID, "stack", in.Tags[TagStack], "machine", in.Tags[TagMachine])
	return nil
}

// Tidy removes what needs no decision about stacks: machines a crash left half-created (no
// Create holds them) and network namespaces, veths and cgroups no machine owns. kloud serve
// runs it at startup; kloud's garbage collector (kloud gc) decides about whole machines.
func (l *Local) Tidy(ctx context.Context) ([]string, error) {
	m, err := l.manager()
	if err != nil {
		return nil, err
	}
	return m.GC(ctx, func(sandbox.Info) bool { return true })
}

// removeLeftovers removes what machine r.ID left without a record, if it is still there and
// this instance's.
func (i inventory) removeLeftovers(ctx context.Context, m *sandbox.Manager, r provider.Resource) error {
	los, err := m.Leftovers(ctx)
	if err != nil {
		return err
	}
	for _, lo := range los {
		if lo.ID != r.ID {
			continue
		}
		if lo.Instance != i.l.instance {
			return fmt.Errorf("leftovers of local machine %s belong to kloud instance %q, not this one (%s): not removed", r.ID, lo.Instance, i.l.instance)
		}
		if err := m.RemoveLeftover(ctx, lo); err != nil {
			return fmt.Errorf("remove leftovers of local machine %s: %w", r.ID, err)
		}
		i.l.log.Info("local provider: removed a machine's leftovers", "id", r.ID, "parts", lo.Parts(), "stack", lo.Tags[TagStack], "machine", lo.Tags[TagMachine])
		return nil
	}
	return nil // gone already
}
