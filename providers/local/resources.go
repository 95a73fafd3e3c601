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

// KindMachine is the kind of the local provider's resources.
const KindMachine = "machine"

// inventory is the local provider's provider.ResourceManager (Provider.Inventory).
type inventory struct{ l *Local }

// Resources lists this instance's machines that carry kloud's stack tag, half-created ones
// included (Incomplete), with kloud's tags (provider.Tag*). Machines of other instances, or
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
	return out, nil
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
