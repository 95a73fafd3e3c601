package provider

import (
	"context"
	"fmt"
	"time"
)

// Tags kloud puts on every resource a provider creates (Juju's instance tags): the stack, the
// stack's team and owner, kloud's machine id, and the kloud instance (the id kept in kloud's data
// dir) that made it. They are the keys of Resource.Tags; a provider stores them as it can (the
// local provider in machine.json, docker as container labels, vagrant in its records) and maps
// its own keys to these when it lists its resources. kloud's garbage collector (kloud/gc.go)
// decides from them alone whether a resource is still wanted.
const (
	TagStack    = "kloud.stack"
	TagTeam     = "kloud.team"
	TagOwner    = "kloud.owner"
	TagMachine  = "kloud.machine"
	TagInstance = "kloud.instance"
)

// CapResources: the provider lists the resources it created with kloud's tags and removes one
// (Provider.Inventory is set). Without it, kloud gc skips the provider.
const CapResources Capability = "resources"

// Resource is one thing a provider created for kloud: a machine, a container, a disk.
type Resource struct {
	// ID is the provider's id of it; for a Terraform resource, the "id" attribute Terraform's
	// state records for it (kloud compares the two to find resources a build left behind).
	ID string `json:"id"`
	// Kind is what it is, in the provider's words ("machine", "container", ...).
	Kind string `json:"kind"`
	// Name is a human name (a hostname, a container name), optional.
	Name string `json:"name,omitempty"`
	// Tags are kloud's tags (TagStack, ...) the resource carries; a resource without
	// TagStack and TagInstance is not kloud's to collect.
	Tags map[string]string `json:"tags,omitempty"`
	// CreatedAt is when the provider made it (zero: unknown). kloud leaves resources younger
	// than its grace period alone: a build may be creating them.
	CreatedAt time.Time `json:"createdAt,omitzero"`
	// Incomplete marks a resource whose creation never finished (a crash midway).
	Incomplete bool `json:"incomplete,omitempty"`
	// Orphan marks what is left of a resource the provider no longer has (a local machine's
	// network namespace, veth and cgroups after its record is gone): garbage by itself, whatever
	// its tags say. kloud removes it once it is older than the grace period.
	Orphan bool `json:"orphan,omitempty"`
}

// Tag returns r's tag k ("" if unset).
func (r Resource) Tag(k string) string { return r.Tags[k] }

// String names r in messages: "machine web-1a2b (stack S, machine M)".
func (r Resource) String() string {
	n := r.ID
	if r.Name != "" && r.Name != r.ID {
		n = r.Name + " (" + r.ID + ")"
	}
	return fmt.Sprintf("%s %s", r.Kind, n)
}

// ResourceManager is implemented by providers that can list the resources they created for this
// kloud instance and remove one: what `kloud gc` and kloud's periodic sweep use. Set it as
// Provider.Inventory; Caps then includes CapResources.
type ResourceManager interface {
	// Resources lists the resources of this kloud instance (TagInstance is this kloud's id) that
	// carry kloud's tags, half-created ones included. It never lists another instance's.
	Resources(ctx context.Context) ([]Resource, error)
	// RemoveResource destroys r (as listed by Resources). It refuses a resource of another
	// kloud instance, and removing one that is already gone is no error.
	RemoveResource(ctx context.Context, r Resource) error
}

// ResourceTags returns kloud's tags for a machine: its stack, team, owner, machine id and the
// kloud instance, leaving out those that are empty.
func ResourceTags(stack, team, owner, machine, instance string) map[string]string {
	out := map[string]string{}
	for k, v := range map[string]string{TagStack: stack, TagTeam: team, TagOwner: owner, TagMachine: machine, TagInstance: instance} {
		if v != "" {
			out[k] = v
		}
	}
	return out
}

// MapTags renames a provider's own tag keys to kloud's (keys maps the provider's key to a Tag*
// constant); other tags are kept under their own names unless kloud's name is taken.
func MapTags(own map[string]string, keys map[string]string) map[string]string {
	out := make(map[string]string, len(own))
	for k, v := range own {
		if _, mapped := keys[k]; !mapped {
			out[k] = v
		}
	}
	for from, to := range keys {
		if v, ok := own[from]; ok && v != "" {
			out[to] = v
		}
	}
	return out
}
