package vagrant

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io/fs"
	"net/http"
	"regexp"
	"strings"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/klient/klientapi"
	"github.com/kloud-dev/kloud/provider/machinesvc"
	"github.com/kloud-dev/kloud/providers/vagrant/tfprovider"
)

// The vagrant machine service: what the unprivileged kloudvagrant Terraform provider asks kloud
// to do. kloud mounts it under tfprovider.APIPath (Provider.Handler); the API is documented in
// tfprovider/api.go. kloud does the work by calling the vagrant.* methods of the token's owner's
// host klient.
//
// Authentication: "Authorization: Bearer <token>", a token from Token (ApplyTemplate) for one
// stack (and its owner) of this kloud instance. Authorization: create only with kloud_stack = the
// token's stack and kloud_machine one of the token's machine ids, on the owner's host; read,
// retag and delete only of machines whose record says the token's stack, owner and this kloud
// instance.
const maxPerMachine = 2 // a replacement with create_before_destroy has two for a moment

var machineNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// hostError turns a host's failure into an answer: not connected → 503, refused params → 400,
// anything else the host said → 502.
func hostError(err error) error {
	var ke *kite.Error
	switch {
	case errors.Is(err, kite.ErrUnavailable):
		return machinesvc.Errorf(http.StatusServiceUnavailable, "%s", err)
	case errors.Is(err, kite.ErrInvalidParams):
		return machinesvc.Errorf(http.StatusBadRequest, "%s", err)
	case errors.As(err, &ke) || err != nil:
		return machinesvc.Errorf(http.StatusBadGateway, "%s", err)
	}
	return nil
}

// service is the vagrant machine service's HTTP side (machinesvc.Service): routing, tokens, limits.
func (v *Vagrant) service() *machinesvc.Service {
	return &machinesvc.Service{
		Kind: "vagrant", APIPath: tfprovider.APIPath, Log: v.log,
		Ready:      v.Available,
		ParseToken: v.parseToken,
		Create:     v.createMachine,
		Read:       v.readMachine,
		Tag:        v.tagMachine,
		Delete:     v.deleteMachine,
	}
}

func (v *Vagrant) handler() *http.ServeMux { return v.service().Handler() }

func view(r *record, state string) tfprovider.Machine {
	return tfprovider.Machine{ID: r.Name, Host: r.Host, Hostname: r.Hostname, State: state, Image: r.Image, Box: r.Box,
		Provider: r.Provider, MemoryMB: r.MemoryMB, CPUs: r.CPUs, Tags: r.Tags}
}

// newName names a machine after its host name plus a random suffix, so a replacement never
// collides with the machine it replaces: [a-z0-9-], at most 63.
func newName(hostname string) string {
	b := make([]byte, 4)
	rand.Read(b)
	h := strings.ToLower(hostname)
	if len(h) > 40 {
		h = h[:40]
	}
	return strings.Trim(h, "-") + "-" + hex.EncodeToString(b)
}

func (v *Vagrant) createMachine(ctx context.Context, c *tokenClaims, r *http.Request) (int, any, error) {
	var req tfprovider.CreateRequest
	if err := machinesvc.Decode(r, &req); err != nil {
		return 0, nil, err
	}
	if err := machinesvc.CheckTags(req.Tags); err != nil {
		return 0, nil, err
	}
	if req.MemoryMB < 0 || req.MemoryMB > klientapi.VagrantMaxMemoryMB || req.CPUs < 0 || req.CPUs > klientapi.VagrantMaxCPUs {
		return 0, nil, machinesvc.Errorf(http.StatusBadRequest, "memory %d MiB / cpus %d: out of range", req.MemoryMB, req.CPUs)
	}
	rec := &record{
		Name: newName(req.Hostname), Owner: c.Owner, Instance: v.instance, Hostname: req.Hostname,
		Image: req.Image, Box: req.Box, Provider: req.Provider, MemoryMB: req.MemoryMB, CPUs: req.CPUs, Tags: req.Tags,
	}
	params := klientapi.VagrantCreateParams{
		Name: rec.Name, Provider: req.Provider, Box: req.Box, Image: req.Image, Hostname: req.Hostname,
		MemoryMB: int(req.MemoryMB), CPUs: int(req.CPUs), UserData: req.UserData,
	}
	if req.Hostname == "" {
		return 0, nil, machinesvc.Errorf(http.StatusBadRequest, "hostname is required")
	}
	check := params
	check.Name = "x" // the name is ours; check the user's values first, for a message about them
	if err := check.ValidateMachine(); err != nil {
		return 0, nil, machinesvc.Errorf(http.StatusBadRequest, "%s", err)
	}
	if err := params.ValidateMachine(); err != nil {
		return 0, nil, machinesvc.Errorf(http.StatusBadRequest, "%s", err)
	}
	stack, mid := req.Tags[TagStack], req.Tags[TagMachine]
	if stack != c.Stack {
		return 0, nil, machinesvc.Errorf(http.StatusForbidden, "tag %s = %q: this token is for stack %s only", TagStack, stack, c.Stack)
	}
	if !c.MayCreate(mid) {
		return 0, nil, machinesvc.Errorf(http.StatusForbidden, "tag %s = %q: not a machine of this build of stack %s", TagMachine, mid, c.Stack)
	}
	all, err := v.records()
	if err != nil {
		return 0, nil, err
	}
	n := 0
	for _, o := range all {
		if o.Tags[TagStack] == stack && o.Tags[TagMachine] == mid {
			n++
		}
	}
	if n >= maxPerMachine {
		return 0, nil, machinesvc.Errorf(http.StatusConflict, "machine %s of stack %s has %d vagrant machines already; destroy them first", mid, stack, n)
	}
	h, err := v.hosts.Host(ctx, c.Owner, "")
	if err != nil {
		return 0, nil, hostError(err)
	}
	rec.Host = h.KiteID
	// The record first: a crash after this leaves a machine kloud knows it may destroy (GC).
	v.setInflight(rec.Name, true)
	defer v.setInflight(rec.Name, false)
	if err := v.writeRecord(rec); err != nil {
		return 0, nil, err
	}
	params.Token = h.Token
	var vm klientapi.VagrantMachine
	err = v.call(ctx, h, klientapi.MethodVagrantCreate, params, &vm)
	if err == nil {
		err = v.call(ctx, h, klientapi.MethodVagrantUp, klientapi.VagrantNameParams{Token: h.Token, Name: rec.Name}, &vm)
	}
	if err != nil {
		// Nothing half-made stays: destroy what the host has (with its own context: the
		// request's may be what ended).
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), v.opts.OpTimeout)
		defer cancel()
		if derr := v.call(dctx, h, klientapi.MethodVagrantDestroy, klientapi.VagrantNameParams{Token: h.Token, Name: rec.Name}, nil); derr == nil {
			v.removeRecord(rec.Name)
		} else {
			v.log.Warn("vagrant machine service: destroy after a failed create", "machine", rec.Name, "host", h.KiteID, "err", derr)
		}
		return 0, nil, hostError(err)
	}
	rec.Complete = true
	if err := v.writeRecord(rec); err != nil {
		return 0, nil, err
	}
	v.log.Info("vagrant machine service: created", "stack", stack, "machine", mid, "name", rec.Name, "host", h.KiteID, "state", vm.State)
	return http.StatusCreated, view(rec, vm.State), nil
}

// owned loads machine {id}'s record and checks that it is the token's stack's, owner's and this
// instance's. An absent record is (nil, nil).
func (v *Vagrant) owned(c *tokenClaims, r *http.Request) (*record, error) {
	id := r.PathValue("id")
	if !machineNameRE.MatchString(id) {
		return nil, machinesvc.Errorf(http.StatusBadRequest, "machine id %q: want 1-63 of [a-z0-9-]", id)
	}
	rec, err := v.readRecord(id)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if rec.Tags[TagStack] != c.Stack || rec.Owner != c.Owner {
		return nil, machinesvc.Errorf(http.StatusForbidden, "machine %s is not a machine of stack %s", id, c.Stack)
	}
	if rec.Instance != v.instance {
		return nil, machinesvc.Errorf(http.StatusForbidden, "machine %s belongs to another kloud instance", id)
	}
	return rec, nil
}

// status asks the machine's host for its state.
func (v *Vagrant) status(ctx context.Context, rec *record) (klientapi.VagrantMachine, error) {
	h, err := v.hosts.Host(ctx, rec.Owner, rec.Host)
	if err != nil {
		return klientapi.VagrantMachine{}, err
	}
	var vm klientapi.VagrantMachine
	err = v.call(ctx, h, klientapi.MethodVagrantStatus, klientapi.VagrantNameParams{Token: h.Token, Name: rec.Name}, &vm)
	return vm, err
}

func (v *Vagrant) readMachine(ctx context.Context, c *tokenClaims, r *http.Request) (int, any, error) {
	rec, err := v.owned(c, r)
	if err != nil {
		return 0, nil, err
	}
	if rec == nil {
		return 0, nil, machinesvc.Errorf(http.StatusNotFound, "machine %s does not exist", r.PathValue("id"))
	}
	vm, err := v.status(ctx, rec)
	if err != nil {
		return 0, nil, hostError(err)
	}
	if vm.State == klientapi.VagrantAbsent {
		v.removeRecord(rec.Name)
		return 0, nil, machinesvc.Errorf(http.StatusNotFound, "machine %s does not exist on its host %s", rec.Name, rec.Host)
	}
	return http.StatusOK, view(rec, vm.State), nil
}

func (v *Vagrant) tagMachine(ctx context.Context, c *tokenClaims, r *http.Request) (int, any, error) {
	var req tfprovider.TagsRequest
	if err := machinesvc.Decode(r, &req); err != nil {
		return 0, nil, err
	}
	if err := machinesvc.CheckTags(req.Tags); err != nil {
		return 0, nil, err
	}
	rec, err := v.owned(c, r)
	if err != nil {
		return 0, nil, err
	}
	if rec == nil {
		return 0, nil, machinesvc.Errorf(http.StatusNotFound, "machine %s does not exist", r.PathValue("id"))
	}
	if s := req.Tags[TagStack]; s != c.Stack {
		return 0, nil, machinesvc.Errorf(http.StatusForbidden, "tag %s = %q: a machine of stack %s stays in it", TagStack, s, c.Stack)
	}
	if mid := req.Tags[TagMachine]; mid != rec.Tags[TagMachine] && !c.MayCreate(mid) {
		return 0, nil, machinesvc.Errorf(http.StatusForbidden, "tag %s = %q: not a machine of this build of stack %s", TagMachine, mid, c.Stack)
	}
	rec.Tags = req.Tags
	if err := v.writeRecord(rec); err != nil {
		return 0, nil, err
	}
	state := klientapi.VagrantUnknown
	if vm, err := v.status(ctx, rec); err == nil {
		state = vm.State
	}
	return http.StatusOK, view(rec, state), nil
}

func (v *Vagrant) deleteMachine(ctx context.Context, c *tokenClaims, r *http.Request) (int, any, error) {
	rec, err := v.owned(c, r)
	if err != nil {
		return 0, nil, err
	}
	if rec == nil {
		return http.StatusNoContent, nil, nil
	}
	h, err := v.hosts.Host(ctx, rec.Owner, rec.Host)
	if err != nil {
		return 0, nil, hostError(err)
	}
	if err := v.call(ctx, h, klientapi.MethodVagrantDestroy, klientapi.VagrantNameParams{Token: h.Token, Name: rec.Name}, nil); err != nil {
		return 0, nil, hostError(err)
	}
	if err := v.removeRecord(rec.Name); err != nil {
		return 0, nil, err
	}
	v.log.Info("vagrant machine service: destroyed", "stack", c.Stack, "machine", rec.Tags[TagMachine], "name", rec.Name, "host", rec.Host)
	return http.StatusNoContent, nil, nil
}
