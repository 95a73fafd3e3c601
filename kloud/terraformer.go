package kloud

import (
	"context"

	tfjson "github.com/hashicorp/terraform-json"

	"github.com/kloud-dev/kloud/terraformer/tfapi"
	"github.com/kloud-dev/kloud/terraformer/tfclient"
)

// Terraformer runs Terraform for kloud: tfclient.Client (a remote terraformer over the kite
// protocol) implements it. While terraformer is down (kloud serve restarts the one it started),
// its methods fail at once with an error wrapping tfclient.ErrUnavailable (kite code -32009,
// "terraformer unavailable: <cause>"), which kloud passes on to its callers as it is; Wait
// follows a job through a restart, for a bounded time.
type Terraformer interface {
	Plan(ctx context.Context, req tfapi.Request) (jobID string, err error)
	Apply(ctx context.Context, req tfapi.Request) (jobID string, err error)
	Destroy(ctx context.Context, req tfapi.Request) (jobID string, err error)
	// Wait follows a job to its end, calling fn for every event, and returns the final job.
	Wait(ctx context.Context, jobID string, fn func(tfapi.Event)) (*tfapi.Job, error)
	Cancel(ctx context.Context, jobID string) (*tfapi.Job, error)
	Outputs(ctx context.Context, contentID string) (map[string]any, error)
	// State is the content id's last state (kite.ErrNotFound when there is none).
	State(ctx context.Context, contentID string) (*tfjson.State, error)
}

var _ Terraformer = (*tfclient.Client)(nil)
