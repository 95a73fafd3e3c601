package api

import (
	"context"
	"errors"
	"fmt"
	"regexp"

	"github.com/kloud-dev/kloud/kloud/model"
)

// Prebuilt stacks (issue 25): an administrator orders, per template (and preset), a pool of
// stacks that kloud keeps built and owned by no user (model.PoolOwner); stack.create of that
// template (and preset) claims one when one is ready.

// Pool methods.
const (
	MethodPoolSet    = "pool.set"    // kloud administrators
	MethodPoolList   = "pool.list"   // kloud administrators and auditors
	MethodPoolDelete = "pool.delete" // kloud administrators
)

// MaxPoolSize bounds a pool's size (each stack of it is built and kept running).
const MaxPoolSize = 50

var presetRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$`)

// PoolSetParams are pool.set's: the pool of TemplateID's stacks (with Preset, when the template
// has presets) and its size (0 keeps the pool and destroys its idle stacks).
type PoolSetParams struct {
	TemplateID string `json:"templateId"`
	Preset     string `json:"preset,omitempty"`
	Size       int    `json:"size"`
	// Schedule and TimeZone change the size by the time of day and week (PoolSize; none: Size
	// at all times).
	Schedule []model.PoolWindow `json:"schedule,omitempty"`
	TimeZone string             `json:"timeZone,omitempty"`
}

// Validate implements kite.Validator.
func (p *PoolSetParams) Validate() error {
	var errs []error
	if p.TemplateID == "" {
		errs = append(errs, errors.New("templateId is required"))
	}
	if p.Preset != "" && !presetRE.MatchString(p.Preset) {
		errs = append(errs, fmt.Errorf("preset %q: want a preset's name", p.Preset))
	}
	if p.Size < 0 || p.Size > MaxPoolSize {
		errs = append(errs, fmt.Errorf("size %d: want 0 to %d", p.Size, MaxPoolSize))
	}
	if err := ValidatePoolSchedule(p.Schedule, p.TimeZone); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// PoolRef names a pool (its id: the template's id, or "<template id>/<preset>").
type PoolRef struct {
	ID string `json:"id"`
}

// Validate implements kite.Validator.
func (p *PoolRef) Validate() error {
	if p.ID == "" {
		return errors.New("id is required")
	}
	return nil
}

// PoolListParams are pool.list's: a team's pools ("": every team's).
type PoolListParams struct {
	Team string `json:"team,omitempty"`
}

// PoolView is a pool with its stacks counted: Ready (built at the template's latest revision,
// idle: what stack.create claims), Building, Stale (of an older revision, to be replaced),
// Failed, and Claimed (stacks built for it that users own now).
type PoolView struct {
	model.Pool
	Rev      int `json:"rev"`     // the template's latest revision, the one the pool builds
	Current  int `json:"current"` // the size in effect now (its schedule's, else Size)
	Ready    int `json:"ready"`
	Building int `json:"building"`
	Stale    int `json:"stale"`
	Failed   int `json:"failed"`
	Claimed  int `json:"claimed"`
}

// PoolListResult is pool.list's answer.
type PoolListResult struct {
	Pools []PoolView `json:"pools"`
}

// PoolSet creates, resizes or empties a pool.
func (c *Client) PoolSet(ctx context.Context, p PoolSetParams) (PoolView, error) {
	return RPCPoolSet.Call(ctx, c.c, p)
}

// PoolList lists pools with their stacks counted.
func (c *Client) PoolList(ctx context.Context, p PoolListParams) (PoolListResult, error) {
	return RPCPoolList.Call(ctx, c.c, p)
}

// PoolDelete removes a pool; kloud destroys its idle stacks.
func (c *Client) PoolDelete(ctx context.Context, p PoolRef) (DeleteResult, error) {
	return RPCPoolDelete.Call(ctx, c.c, p)
}
