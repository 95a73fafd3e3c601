package docker

import (
	"context"
	"fmt"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/kloud-dev/kloud/provider"
)

// LabelTeam is the label of the stack's team kloud puts on every container (besides
// LabelStack, LabelMachine, LabelOwner and LabelInstance, docker.go).
const LabelTeam = "kloud_team"

// KindContainer is the kind of the docker provider's resources.
const KindContainer = "container"

// labelTags maps kloud's container labels to kloud's tags (provider.Tag*).
func labelTags() map[string]string {
	return map[string]string{LabelStack: provider.TagStack, LabelMachine: provider.TagMachine, LabelOwner: provider.TagOwner,
		LabelTeam: provider.TagTeam, LabelInstance: provider.TagInstance}
}

// inventory is the docker provider's provider.ResourceManager (Provider.Inventory).
type inventory struct{ d *Docker }

// Resources lists this instance's containers (label kloud_instance) that carry kloud_stack, with
// kloud's tags; the id is the full container id, as docker_container's state has it.
func (i inventory) Resources(ctx context.Context) ([]provider.Resource, error) {
	cli, err := i.d.Client()
	if err != nil {
		return nil, err
	}
	cs, err := i.d.instanceContainers(ctx, cli)
	if err != nil {
		return nil, err
	}
	var out []provider.Resource
	for _, c := range cs {
		if c.Labels[LabelStack] == "" {
			continue
		}
		r := provider.Resource{ID: c.ID, Kind: KindContainer, Tags: provider.MapTags(c.Labels, labelTags())}
		if len(c.Names) > 0 {
			r.Name = strings.TrimPrefix(c.Names[0], "/")
		}
		if c.Created > 0 {
			r.CreatedAt = time.Unix(c.Created, 0).UTC()
		}
		out = append(out, r)
	}
	return out, nil
}

// RemoveResource removes container r.ID (and its anonymous volumes) if it is still this
// instance's container of r's stack and machine, and the machines' network if no container is
// left on it. A container already gone is no error.
func (i inventory) RemoveResource(ctx context.Context, r provider.Resource) error {
	cli, err := i.d.Client()
	if err != nil {
		return err
	}
	if r.Kind != KindContainer || r.ID == "" {
		return fmt.Errorf("docker provider: %s is not a container", r)
	}
	res, err := cli.ContainerInspect(ctx, r.ID, client.ContainerInspectOptions{})
	if cerrdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("inspect container %.12s: %w", r.ID, err)
	}
	var lbl map[string]string
	if res.Container.Config != nil {
		lbl = res.Container.Config.Labels
	}
	switch {
	case lbl[LabelInstance] != i.d.instance:
		return fmt.Errorf("container %.12s is not this kloud instance's (%s): not removed", r.ID, i.d.instance)
	case lbl[LabelStack] != r.Tag(provider.TagStack) || lbl[LabelMachine] != r.Tag(provider.TagMachine):
		return fmt.Errorf("container %.12s is now labelled for another stack or machine than listed: not removed (list again)", r.ID)
	}
	if _, err := cli.ContainerRemove(ctx, r.ID, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true}); err != nil && !cerrdefs.IsNotFound(err) {
		return fmt.Errorf("remove container %.12s: %w", r.ID, err)
	}
	// The network goes with the last container, as after GC (network.go).
	if _, err := i.d.removeNetworkIfUnused(ctx); err != nil {
		return err
	}
	return nil
}
