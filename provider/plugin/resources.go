package plugin

import (
	"context"
	"errors"
	"fmt"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/provider"
)

// The wire of capability "resources" (provider.ResourceManager, Provider.Inventory): kloud's
// garbage collector lists a plugin's resources and removes one. A plugin whose Provider has an
// Inventory advertises the capability (Caps derives it) and serves both methods; kloud's proxy
// of it gets an Inventory that calls them.
const (
	MethodResources      = "provider.resources"
	MethodRemoveResource = "provider.removeResource"
)

// maxResources bounds one listing (it travels in one kite frame).
const maxResources = 10000

type resourcesResult struct {
	Resources []provider.Resource `json:"resources"`
}

type removeResourceParams struct {
	Resource provider.Resource `json:"resource"`
}

// Validate implements kite.Validator.
func (p *removeResourceParams) Validate() error {
	if p.Resource.ID == "" || p.Resource.Kind == "" {
		return errors.New("resource: id and kind are required (a resource as provider.resources listed it)")
	}
	return nil
}

// proxyInventory is a plugin's provider.ResourceManager in kloud.
type proxyInventory struct {
	h    *Host
	name string
}

func (i proxyInventory) Resources(ctx context.Context) ([]provider.Resource, error) {
	var res resourcesResult
	if err := i.h.call(ctx, i.name, MethodResources, struct{}{}, &res); err != nil {
		return nil, err
	}
	if len(res.Resources) > maxResources {
		return nil, fmt.Errorf("provider %s listed %d resources, at most %d", i.name, len(res.Resources), maxResources)
	}
	return res.Resources, nil
}

func (i proxyInventory) RemoveResource(ctx context.Context, r provider.Resource) error {
	return i.h.call(ctx, i.name, MethodRemoveResource, &removeResourceParams{Resource: r}, nil)
}

// setInventory gives proxy p an Inventory if the plugin advertised "resources".
func (h *Host) setInventory(p *provider.Provider, name string, can func(provider.Capability) bool) {
	if can(provider.CapResources) {
		p.Inventory = proxyInventory{h: h, name: name}
	}
}

// handleResources serves the methods on the plugin's side.
func (s *server) handleResources(k *kite.Kite) {
	k.Handle(MethodResources, kite.HandlerFunc(s.resources))
	k.Handle(MethodRemoveResource, kite.Typed(s.removeResource))
}

func (s *server) resources(ctx context.Context, _ *kite.Request) (any, error) {
	if s.p.Inventory == nil {
		return nil, wireErr(fmt.Errorf("resources: %w", provider.ErrUnsupported))
	}
	rs, err := s.p.Inventory.Resources(ctx)
	if err != nil {
		return nil, wireErr(err)
	}
	if rs == nil {
		rs = []provider.Resource{}
	}
	return resourcesResult{Resources: rs}, nil
}

func (s *server) removeResource(ctx context.Context, _ *kite.Request, p *removeResourceParams) (any, error) {
	if s.p.Inventory == nil {
		return nil, wireErr(fmt.Errorf("remove resource: %w", provider.ErrUnsupported))
	}
	if err := s.p.Inventory.RemoveResource(ctx, p.Resource); err != nil {
		return nil, wireErr(err)
	}
	return struct{}{}, nil
}
