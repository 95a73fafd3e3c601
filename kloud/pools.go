package kloud

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/provider/tmpl"
)

// Prebuilt stacks: pool.set, pool.list and pool.delete (an administrator's orders, in the pools
// collection). A pool's stacks are ordinary stacks owned by model.PoolOwner with Stack.Pool set;
// store.Stacks.Claim hands one to a user.

// poolAPI serves pool.*. Server.pools is the one value, made in New.
type poolAPI struct {
	store *store.Store
	srv   *Server
	log   *slog.Logger
}

// set serves pool.set: the pool of a template's stacks (with a preset the template has) and
// its size.
func (a *poolAPI) set(ctx context.Context, c *Caller, _ *kite.Request, p *api.PoolSetParams) (api.PoolView, error) {
	t, err := a.srv.loadTemplate(ctx, c, p.TemplateID)
	if err != nil {
		return api.PoolView{}, err
	}
	if p.Preset != "" {
		cfg, err := tmpl.Parse(fileMap(t.Files))
		if err != nil {
			return api.PoolView{}, fmt.Errorf("template %s: %s: %w", t.ID, err.Error(), kite.ErrInvalidParams)
		}
		ps, err := a.srv.templateParams(cfg)
		if err != nil {
			return api.PoolView{}, err
		}
		if !slices.ContainsFunc(ps.Presets, func(pr tmpl.Preset) bool { return pr.Name == p.Preset }) {
			return api.PoolView{}, fmt.Errorf("template %s has no preset %q: %w", t.ID, p.Preset, kite.ErrInvalidParams)
		}
	}
	pool := model.Pool{ID: model.PoolID(t.ID, p.Preset), Team: t.Team, TemplateID: t.ID, Preset: p.Preset, Size: p.Size, UpdatedBy: c.Username}
	if err := a.store.Pools().Set(ctx, pool); err != nil {
		return api.PoolView{}, err
	}
	a.log.InfoContext(ctx, "pool set", "pool", pool.ID, "size", pool.Size, "by", c.Username)
	return a.view(ctx, pool)
}

// list serves pool.list.
func (a *poolAPI) list(ctx context.Context, _ *Caller, _ *kite.Request, p *api.PoolListParams) (api.PoolListResult, error) {
	ps, err := a.store.Pools().List(ctx, p.Team)
	if err != nil {
		return api.PoolListResult{}, err
	}
	out := api.PoolListResult{Pools: []api.PoolView{}}
	for _, pool := range ps {
		v, err := a.view(ctx, pool)
		if err != nil {
			return api.PoolListResult{}, err
		}
		out.Pools = append(out.Pools, v)
	}
	return out, nil
}

// delete serves pool.delete: the pool goes; its idle stacks are destroyed by the pools'
// reconciler, the claimed ones stay their users'.
func (a *poolAPI) delete(ctx context.Context, c *Caller, _ *kite.Request, p *api.PoolRef) (api.DeleteResult, error) {
	if _, err := a.store.Pools().Get(ctx, p.ID); errors.Is(err, store.ErrNotFound) {
		return api.DeleteResult{}, notFound("pool", p.ID)
	} else if err != nil {
		return api.DeleteResult{}, err
	}
	if err := a.store.Pools().Delete(ctx, p.ID); err != nil {
		return api.DeleteResult{}, err
	}
	a.log.InfoContext(ctx, "pool deleted", "pool", p.ID, "by", c.Username)
	return api.DeleteResult{Deleted: true}, nil
}

// view counts pool's stacks.
func (a *poolAPI) view(ctx context.Context, pool model.Pool) (api.PoolView, error) {
	v := api.PoolView{Pool: pool}
	t, err := a.store.Templates().Get(ctx, pool.TemplateID)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return v, err
	}
	v.Rev = t.Rev
	sts, err := a.store.Stacks().OfPool(ctx, pool.ID)
	if err != nil {
		return v, err
	}
	for _, st := range sts {
		switch {
		case st.State == model.StackFailed:
			v.Failed++
		case st.TemplateRev != v.Rev:
			v.Stale++
		case st.State == model.StackInitialized && st.JobID == "":
			v.Ready++
		default:
			v.Building++
		}
	}
	if v.Claimed, err = a.store.Stacks().CountClaimed(ctx, pool.ID); err != nil {
		return v, err
	}
	return v, nil
}
