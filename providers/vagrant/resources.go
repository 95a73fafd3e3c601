package vagrant

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/kloud-dev/kloud/klient/klientapi"
	"github.com/kloud-dev/kloud/provider"
)

// More tags kloud puts on every machine (besides TagStack and TagMachine, vagrant.go): the
// stack's team and owner. The owner and the kloud instance are also the record's own fields,
// which Resources reports (they are what the service checks).
const (
	TagTeam  = "kloud_team"
	TagOwner = "kloud_owner"
)

// KindMachine is the kind of the vagrant provider's resources.
const KindMachine = "vagrant-machine"

// inventory is the vagrant provider's provider.ResourceManager (Provider.Inventory): its
// resources are this instance's machine records. kloud's gc (and kloud serve's vagrant sweep,
// kloud/cli/serve_vagrant.go, which runs it for this provider when a host registers) removes
// those of stacks kloud no longer has and those a crash left half-created.
type inventory struct{ v *Vagrant }

// Resources lists this instance's vagrant machines (records) that carry kloud's stack tag, those
// a crash left half-created included (Incomplete), but not those a create of this process is
// making. The id is the machine's name, as kloudvagrant_machine's state has it; the creation time
// is the record's last write (a record is rewritten when its machine completes or is retagged:
// never earlier than the machine), none for a half-made one.
func (i inventory) Resources(ctx context.Context) ([]provider.Resource, error) {
	v := i.v
	recs, err := v.records()
	if err != nil {
		return nil, fmt.Errorf("vagrant machine records: %w", err)
	}
	var out []provider.Resource
	for _, r := range recs {
		if r.Instance != v.instance || r.Tags[TagStack] == "" || v.inflight(r.Name) {
			continue
		}
		tags := provider.MapTags(r.Tags, map[string]string{TagStack: provider.TagStack, TagMachine: provider.TagMachine, TagTeam: provider.TagTeam, TagOwner: provider.TagOwner})
		tags[provider.TagOwner], tags[provider.TagInstance] = r.Owner, r.Instance
		res := provider.Resource{ID: r.Name, Kind: KindMachine, Name: r.Hostname, Tags: tags, Incomplete: !r.Complete}
		// A half-made machine no create of this process is making is what a crash left: no
		// creation time, so kloud's gc does not wait out its grace period for it.
		if fi, err := os.Stat(v.recordPath(r.Name)); err == nil && r.Complete {
			res.CreatedAt = fi.ModTime().UTC()
		}
		out = append(out, res)
	}
	return out, nil
}

// RemoveResource destroys vagrant machine r.ID on its owner's host and removes its record, if it
// is still this instance's machine of r's stack and no create of it runs. A host that is not
// connected is an error (the next sweep tries again); a machine already gone is none.
func (i inventory) RemoveResource(ctx context.Context, r provider.Resource) error {
	v := i.v
	if r.Kind != KindMachine {
		return fmt.Errorf("vagrant provider: %s is not a vagrant machine", r)
	}
	if v.inflight(r.ID) {
		return fmt.Errorf("vagrant machine %s is being created: not removed", r.ID)
	}
	rec, err := v.readRecord(r.ID)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	switch {
	case rec.Instance != v.instance:
		return fmt.Errorf("vagrant machine %s belongs to kloud instance %q, not this one: not removed", r.ID, rec.Instance)
	case rec.Tags[TagStack] != r.Tag(provider.TagStack) || rec.Tags[TagMachine] != r.Tag(provider.TagMachine):
		return fmt.Errorf("vagrant machine %s is now tagged for another stack or machine than listed: not removed (list again)", r.ID)
	}
	return v.destroyRecorded(ctx, rec)
}

// destroyRecorded destroys the machine of record r on its host and removes the record.
func (v *Vagrant) destroyRecorded(ctx context.Context, r *record) error {
	h, err := v.hosts.Host(ctx, r.Owner, r.Host)
	if err != nil {
		return fmt.Errorf("vagrant machine %s: host %s of %s is not connected (%w); it is removed once the host is back", r.Name, r.Host, r.Owner, err)
	}
	if err := v.call(ctx, h, klientapi.MethodVagrantDestroy, klientapi.VagrantNameParams{Token: h.Token, Name: r.Name}, nil); err != nil {
		return fmt.Errorf("destroy vagrant machine %s on %s: %w", r.Name, r.Host, err)
	}
	if err := v.removeRecord(r.Name); err != nil {
		return err
	}
	v.log.Info("vagrant provider: removed a machine", "name", r.Name, "host", r.Host, "stack", r.Tags[TagStack], "machine", r.Tags[TagMachine], "complete", r.Complete)
	return nil
}
