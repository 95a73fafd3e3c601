package terraformer

import (
	"context"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/terraformer/tfapi"
)

// The client kloud uses is tfapi.Client (terraformer/tfapi, which links no engine); these are
// its names here.

// Client is kloud's side of terraformer (tfapi.Client).
type Client = tfapi.Client

// Health is what terraformer's GET /healthz and /readyz say (Client.Health).
type Health = tfapi.Health

// UnavailableError says why terraformer cannot be called now (tfapi.UnavailableError).
type UnavailableError = tfapi.UnavailableError

// ErrUnavailable is wrapped by the errors of calls made while terraformer is down or
// unreachable; it is kite.ErrUnavailable.
var ErrUnavailable = tfapi.ErrUnavailable

// NewClient is tfapi.NewClient.
func NewClient(k *kite.Kite, rawURL string, auth func(ctx context.Context) (kite.Auth, error)) *Client {
	return tfapi.NewClient(k, rawURL, auth)
}

// KiteURL returns the kite endpoint for a terraformer URL: a URL without a path gets /kite.
func KiteURL(raw string) string { return tfapi.KiteURL(raw) }
