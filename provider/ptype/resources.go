package ptype

import (
	"fmt"
	"time"
)

// Resource is one thing a provider created for kloud: a machine, a container, a disk.
type Resource struct {
	// ID is the provider's id of it; for a Terraform resource, the "id" attribute Terraform's
	// state records for it (kloud compares the two to find resources a build left behind).
	ID string `json:"id"`
	// Kind is what it is, in the provider's words ("machine", "container", ...).
	Kind string `json:"kind"`
	// Name is a human name (a hostname, a container name), optional.
	Name string `json:"name,omitempty"`
	// Tags are kloud's tags (provider.TagStack, ...) the resource carries; a resource without
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
