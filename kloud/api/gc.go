package api

import (
	"context"
	"fmt"
	"regexp"

	"github.com/kloud-dev/kloud/provider/ptype"
)

// GCRunParams are the params of gc.run.
type GCRunParams struct {
	// DryRun lists what would be removed, and why, and removes nothing.
	DryRun bool `json:"dryRun,omitempty"`
	// Provider limits the run to one provider (default: every provider that advertises
	// "resources").
	Provider string `json:"provider,omitempty"`
}

var providerNameRE = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,63}$`)

// Validate implements kite.Validator.
func (p *GCRunParams) Validate() error {
	if p.Provider != "" && !providerNameRE.MatchString(p.Provider) {
		return fmt.Errorf("provider %q: not a provider name (see provider.list)", p.Provider)
	}
	return nil
}

// GCResult is the result of gc.run.
type GCResult struct {
	DryRun bool `json:"dryRun"`
	// Providers are the providers looked at, with how many resources each listed.
	Providers []GCProvider `json:"providers"`
	// Garbage is what was removed (or, with dryRun, would be), with the reason.
	Garbage []GCItem `json:"garbage"`
}

// GCProvider is one provider of a gc.run.
type GCProvider struct {
	Name      string `json:"name"`
	Resources int    `json:"resources"`
	// Error says why its resources could not be listed (the run goes on with the others).
	Error string `json:"error,omitempty"`
}

// GCItem is one resource gc.run found to be garbage.
type GCItem struct {
	Provider string         `json:"provider"`
	Resource ptype.Resource `json:"resource"`
	// Reason says why it is garbage ("stack S no longer exists", ...).
	Reason string `json:"reason"`
	// Removed is true once removed (never with dryRun); Error says why the removal failed.
	Removed bool   `json:"removed"`
	Error   string `json:"error,omitempty"`
}

// GCRun collects the garbage of the providers' resources (kloud administrators).
func (c *Client) GCRun(ctx context.Context, p GCRunParams) (GCResult, error) {
	return RPCGCRun.Call(ctx, c.c, p)
}
