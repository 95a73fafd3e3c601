package local

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"

	"github.com/kloud-dev/kloud/provider/machinesvc"
	"github.com/kloud-dev/kloud/providers/local/sandbox"
	"github.com/kloud-dev/kloud/providers/local/tfprovider"
)

// The local machine service: what the unprivileged kloudlocal Terraform provider asks kloud's
// process (root) to do. kloud mounts it under tfprovider.APIPath (Provider.Handler); the API is
// documented in tfprovider/api.go.
//
// Authentication: "Authorization: Bearer <token>", a token from mintToken (ApplyTemplate), for one
// stack of this kloud instance. Authorization: create only with kloud_stack = the token's stack
// and kloud_machine one of the token's machine ids; read, retag and delete only of machines whose
// record says the token's stack (kloud_stack) and this kloud instance. A machine without an
// instance (made before instance ids existed) counts as this instance's when its stack is the
// token's: stack ids are random, so another kloud's stack cannot match.
const (
	maxUserData = 1 << 20
	// maxPerMachine bounds the machines one kloud machine id may have at once (a replacement
	// with create_before_destroy has two for a moment).
	maxPerMachine = 2
)

var (
	hostnameRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$`)
	idRE       = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
)

// service is the local machine service's HTTP side (machinesvc.Service): routing, tokens, limits.
func (l *Local) service() *machinesvc.Service {
	return &machinesvc.Service{
		Kind: "local", APIPath: tfprovider.APIPath, Log: l.log,
		Ready:      l.ready,
		ParseToken: l.parseToken,
		Create:     l.createMachine,
		Read:       l.readMachine,
		Tag:        l.tagMachine,
		Delete:     l.deleteMachine,
	}
}

func (l *Local) handler() *http.ServeMux { return l.service().Handler() }

func view(in sandbox.Info) tfprovider.Machine {
	m := tfprovider.Machine{ID: in.ID, Hostname: in.Hostname, State: string(in.State), MemoryMB: int64(in.MemoryMB), CPUs: in.CPUs, DiskMB: int64(in.DiskMB), Tags: in.Tags}
	if in.IP.IsValid() {
		m.IPAddress = in.IP.String()
	}
	return m
}

// newID names a machine after its host name plus a random suffix, so a replacement never
// collides with the machine it replaces.
func newID(hostname string) string {
	b := make([]byte, 4)
	rand.Read(b)
	h := strings.ToLower(hostname)
	if len(h) > 40 {
		h = h[:40]
	}
	return strings.TrimRight(h, ".-") + "-" + hex.EncodeToString(b)
}

func (l *Local) createMachine(ctx context.Context, c *tokenClaims, r *http.Request) (int, any, error) {
	var req tfprovider.CreateRequest
	if err := machinesvc.Decode(r, &req); err != nil {
		return 0, nil, err
	}
	if len(req.Hostname) > 63 || !hostnameRE.MatchString(req.Hostname) {
		return 0, nil, machinesvc.Errorf(http.StatusBadRequest, "hostname %q: letters, digits and '-' in dot-separated labels, at most 63 characters", req.Hostname)
	}
	if req.MemoryMB != 0 && (req.MemoryMB < 32 || req.MemoryMB > 1<<20) {
		return 0, nil, machinesvc.Errorf(http.StatusBadRequest, "memory %d MiB: between 32 and %d, or 0 for no limit", req.MemoryMB, 1<<20)
	}
	if req.CPUs != 0 && (req.CPUs < 0.01 || req.CPUs > 1024) {
		return 0, nil, machinesvc.Errorf(http.StatusBadRequest, "cpus %g: between 0.01 and 1024, or 0 for no limit", req.CPUs)
	}
	if req.DiskMB != 0 && (req.DiskMB < sandbox.MinDiskMB || req.DiskMB > 1<<30) {
		return 0, nil, machinesvc.Errorf(http.StatusBadRequest, "disk %d MiB: between %d and %d, or 0 for no quota", req.DiskMB, sandbox.MinDiskMB, 1<<30)
	}
	if len(req.UserData) > maxUserData {
		return 0, nil, machinesvc.Errorf(http.StatusBadRequest, "user data: %d bytes, at most %d", len(req.UserData), maxUserData)
	}
	if err := machinesvc.CheckTags(req.Tags); err != nil {
		return 0, nil, err
	}
	stack, mid := req.Tags[TagStack], req.Tags[TagMachine]
	if stack != c.Stack {
		return 0, nil, machinesvc.Errorf(http.StatusForbidden, "tag %s = %q: this token is for stack %s only", TagStack, stack, c.Stack)
	}
	if !c.MayCreate(mid) {
		return 0, nil, machinesvc.Errorf(http.StatusForbidden, "tag %s = %q: not a machine of this build of stack %s", TagMachine, mid, c.Stack)
	}
	m, err := l.creator(ctx)
	if err != nil {
		return 0, nil, err
	}
	all, err := m.List(ctx)
	if err != nil {
		return 0, nil, err
	}
	n := 0
	for _, in := range all {
		if in.Tags[TagStack] == stack && in.Tags[TagMachine] == mid {
			n++
		}
	}
	if n >= maxPerMachine {
		return 0, nil, machinesvc.Errorf(http.StatusConflict, "machine %s of stack %s has %d local machines already; destroy them first", mid, stack, n)
	}
	spec := sandbox.Spec{
		ID: newID(req.Hostname), Hostname: req.Hostname, MemoryMB: int(req.MemoryMB), CPUs: req.CPUs, DiskMB: int(req.DiskMB),
		Tags: req.Tags, Instance: l.instance,
	}
	if req.UserData != "" {
		spec.UserData = []byte(req.UserData)
	}
	in, err := m.Create(ctx, spec)
	if err != nil {
		return 0, nil, err
	}
	l.log.Info("local machine service: created", "stack", stack, "machine", mid, "id", in.ID, "ip", in.IP)
	return http.StatusCreated, view(in), nil
}

// owned loads machine {id} and checks that it is the token's stack's and this instance's. An
// absent machine is (Info with StateAbsent, nil).
func (l *Local) owned(ctx context.Context, c *tokenClaims, r *http.Request) (sandbox.Info, error) {
	id := r.PathValue("id")
	if !idRE.MatchString(id) {
		return sandbox.Info{}, machinesvc.Errorf(http.StatusBadRequest, "machine id %q: want 1-64 characters of [A-Za-z0-9._-]", id)
	}
	in, err := l.m.Info(ctx, id)
	if err != nil {
		return sandbox.Info{}, err
	}
	if in.State == sandbox.StateAbsent {
		return in, nil
	}
	if s := in.Tags[TagStack]; s != c.Stack {
		return sandbox.Info{}, machinesvc.Errorf(http.StatusForbidden, "machine %s is not a machine of stack %s", id, c.Stack)
	}
	if in.Instance != l.instance && in.Instance != "" {
		return sandbox.Info{}, machinesvc.Errorf(http.StatusForbidden, "machine %s belongs to another kloud instance", id)
	}
	return in, nil
}

func (l *Local) readMachine(ctx context.Context, c *tokenClaims, r *http.Request) (int, any, error) {
	in, err := l.owned(ctx, c, r)
	if err != nil {
		return 0, nil, err
	}
	if in.State == sandbox.StateAbsent {
		return 0, nil, machinesvc.Errorf(http.StatusNotFound, "machine %s does not exist", in.ID)
	}
	return http.StatusOK, view(in), nil
}

func (l *Local) tagMachine(ctx context.Context, c *tokenClaims, r *http.Request) (int, any, error) {
	var req tfprovider.TagsRequest
	if err := machinesvc.Decode(r, &req); err != nil {
		return 0, nil, err
	}
	if err := machinesvc.CheckTags(req.Tags); err != nil {
		return 0, nil, err
	}
	in, err := l.owned(ctx, c, r)
	if err != nil {
		return 0, nil, err
	}
	if in.State == sandbox.StateAbsent {
		return 0, nil, machinesvc.Errorf(http.StatusNotFound, "machine %s does not exist", in.ID)
	}
	if s := req.Tags[TagStack]; s != c.Stack {
		return 0, nil, machinesvc.Errorf(http.StatusForbidden, "tag %s = %q: a machine of stack %s stays in it", TagStack, s, c.Stack)
	}
	if mid := req.Tags[TagMachine]; mid != in.Tags[TagMachine] && !c.MayCreate(mid) {
		return 0, nil, machinesvc.Errorf(http.StatusForbidden, "tag %s = %q: not a machine of this build of stack %s", TagMachine, mid, c.Stack)
	}
	out, err := l.m.SetTags(ctx, in.ID, req.Tags)
	if errors.Is(err, sandbox.ErrNotFound) {
		return 0, nil, machinesvc.Errorf(http.StatusNotFound, "machine %s does not exist", in.ID)
	}
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, view(out), nil
}

func (l *Local) deleteMachine(ctx context.Context, c *tokenClaims, r *http.Request) (int, any, error) {
	in, err := l.owned(ctx, c, r)
	if err != nil {
		return 0, nil, err
	}
	if in.State == sandbox.StateAbsent {
		return http.StatusNoContent, nil, nil
	}
	if err := l.m.Destroy(ctx, in.ID); err != nil {
		return 0, nil, err
	}
	l.log.Info("local machine service: destroyed", "stack", c.Stack, "machine", in.Tags[TagMachine], "id", in.ID)
	return http.StatusNoContent, nil, nil
}

// ready says why the service cannot work on this host (nil: it can).
func (l *Local) ready() error {
	if l.m == nil {
		return fmt.Errorf("local machines cannot run on this host: %v", l.merr)
	}
	return nil
}
