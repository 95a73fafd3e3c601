package kloud

import (
	"context"

	"github.com/kloud-dev/kloud/terraformer/tfrun"
)

// Terraformer runs Terraform for kloud: terraformer.Client (a remote terraformer over the kite
// protocol) implements it.
type Terraformer interface {
	Plan(ctx context.Context, req tfrun.Request) (jobID string, err error)
	Apply(ctx context.Context, req tfrun.Request) (jobID string, err error)
	Destroy(ctx context.Context, req tfrun.Request) (jobID string, err error)
	// Wait follows a job to its end, calling fn for every event, and returns the final job.
	Wait(ctx context.Context, jobID string, fn func(tfrun.Event)) (*tfrun.Job, error)
	Cancel(ctx context.Context, jobID string) error
	Outputs(ctx context.Context, contentID string) (map[string]any, error)
}
