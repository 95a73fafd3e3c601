package terraformer

import (
	"context"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/terraformer/tfapi"
	"github.com/kloud-dev/kloud/terraformer/tfclient"
)

// The client kloud uses is tfclient.Client (terraformer/tfclient, which links no engine); these
// are its names here.

// Client is kloud's side of terraformer (tfclient.Client).
type Client = tfclient.Client

// Health is what terraformer's GET /healthz and /readyz say (Client.Health).
type Health = tfapi.Health

// UnavailableError says why terraformer cannot be called now (tfclient.UnavailableError).
type UnavailableError = tfclient.UnavailableError

// ErrUnavailable is wrapped by the errors of calls made while terraformer is down or
// unreachable; it is kite.ErrUnavailable.
var ErrUnavailable = tfclient.ErrUnavailable

// NewClient is tfclient.NewClient.
func NewClient(k *kite.Kite, rawURL string, auth func(ctx context.Context) (kite.Auth, error)) *Client {
	return tfclient.NewClient(k, rawURL, auth)
}

// KiteURL returns the kite endpoint for a terraformer URL: a URL without a path gets /kite.
func KiteURL(raw string) string { return tfclient.KiteURL(raw) }
