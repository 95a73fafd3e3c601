package terraformer

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/kloud-dev/kloud/kite/kitekey"
)

// AuthOptions configure NewAuthenticator. Zero fields get the defaults in their comments.
type AuthOptions struct {
	// KloudURL is kloud's base URL; kontrol's public keys are fetched from KloudURL + /kite/keys.
	// Default: http://127.0.0.1:7000.
	KloudURL string
	// Issuer is the iss claim kontrol puts in the credentials it signs. Default: "kontrol".
	Issuer string
	// HTTPClient fetches the keys. Default: a client with a 10s timeout.
	HTTPClient *http.Client
	// MinRefresh bounds how often an unknown kid makes the keys be fetched again (default 10s);
	// MaxAge is how long fetched keys are used before they are fetched again (default 5m), so a
	// retired key stops verifying within MaxAge. See kitekey.RemoteKeys.
	MinRefresh, MaxAge time.Duration
}

// DefaultKloudURL is where terraformer looks for kloud unless told otherwise.
const DefaultKloudURL = "http://127.0.0.1:7000"

// KeysURL returns the URL of kontrol's public keys on the kloud at kloudURL.
func KeysURL(kloudURL string) string {
	return strings.TrimSuffix(strings.TrimSuffix(kloudURL, "/"), "/kite") + "/kite/keys"
}

// NewAuthenticator returns the Authenticator for terraformer's kite: kite keys, tokens (and
// sessions, which the service then refuses) signed by kloud's kontrol, with the public keys
// fetched from kloud's GET /kite/keys and cached by a kitekey.RemoteKeys. If kloud cannot be
// reached, keys fetched earlier keep verifying.
//
// Revocations are not checked: kloud publishes no revocation list yet, so a revoked kite key
// with kloud's subject would still be accepted.
func NewAuthenticator(opts AuthOptions) *kitekey.Authenticator {
	if opts.KloudURL == "" {
		opts.KloudURL = DefaultKloudURL
	}
	if opts.Issuer == "" {
		opts.Issuer = "kontrol"
	}
	if opts.HTTPClient == nil {
		opts.HTTPClient = &http.Client{Timeout: 10 * time.Second}
	}
	keys := &kitekey.RemoteKeys{
		Fetch:      FetchKeys(opts.HTTPClient, KeysURL(opts.KloudURL)),
		MinRefresh: opts.MinRefresh,
		MaxAge:     opts.MaxAge,
	}
	return &kitekey.Authenticator{Verifier: &kitekey.Verifier{Keys: keys, Issuer: opts.Issuer}}
}

// maxKeysResponse bounds the body of GET /kite/keys; a key is about 150 bytes.
const maxKeysResponse = 1 << 20

// FetchKeys returns a kitekey.RemoteKeys.Fetch that reads kontrol's public keys from url, which
// answers {"current": kid, "keys": [JWK]} (kloud's GET /kite/keys).
func FetchKeys(client *http.Client, url string) func(ctx context.Context) ([]kitekey.PublicKey, error) {
	return func(ctx context.Context) ([]kitekey.PublicKey, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return nil, fmt.Errorf("fetch keys: %w", err)
		}
		resp, err := client.Do(req)
		if err != nil {
			return nil, fmt.Errorf("fetch keys: %w", err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("fetch keys from %s: %s", url, resp.Status)
		}
		var body struct {
			Current string              `json:"current"`
			Keys    []kitekey.PublicKey `json:"keys"`
		}
		if err := json.NewDecoder(io.LimitReader(resp.Body, maxKeysResponse)).Decode(&body); err != nil {
			return nil, fmt.Errorf("fetch keys from %s: decode: %w", url, err)
		}
		if len(body.Keys) == 0 {
			return nil, fmt.Errorf("fetch keys from %s: no keys", url)
		}
		return body.Keys, nil
	}
}
