package provider

import "context"

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
