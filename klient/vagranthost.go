package klient

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/kloud-dev/kloud/internal/layersnap"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/klient/klientapi"
	"github.com/kloud-dev/kloud/klient/vagrant"
)

// A vagrant host (klient --vagrant, Options.Vagrant): the klient of a user's own host that has
// Vagrant. It authenticates with its owner's kite key like any hand-run klient, registers under
// the kite name klientapi.VagrantHostName, and serves the vagrant.* methods (package
// klient/vagrant does the work) to its owner only: every call carries a kite token for this
// klient whose subject is the owner (kloud mints it for the owner's stack builds). A machine's
// agent key cannot be a host: New refuses it here, and kontrol refuses an agent key that
// registers under the host name.
//
//	vagrant.create  {token, name, provider?, box|image, hostname?, memoryMB?, cpus?, userData?} → VagrantMachine
//	vagrant.up      {token, name} → VagrantMachine    boots it (vagrant up)
//	vagrant.halt    {token, name} → VagrantMachine    stops it, keeps its disk
//	vagrant.destroy {token, name} → {}                removes it and its directory (absent: ok)
//	vagrant.status  {token, name} → VagrantMachine    state "absent" when there is no such machine
//	vagrant.list    {token} → {machines: [...]}
//	vagrant.info    {token} → VagrantHostInfo         the host's CPUs, memory, arch (constraints)
//	vagrant.snapshot.save|restore|delete {token, name, snapshot}   (vagrant_snapshot.go)

// VagrantOptions make a klient its owner's vagrant host.
type VagrantOptions struct {
	// Home holds the machines and Vagrant's data (default StateDir/vagrant).
	Home string
	// Binary is the vagrant command (default "vagrant" on PATH).
	Binary string
	// Env is added to every vagrant command's environment (e.g. DOCKER_HOST=...).
	Env []string
}

func (kl *Klient) setupVagrant() error {
	o := kl.opts.Vagrant
	if kl.claims.Kind == kitekey.KindAgentKey || strings.HasPrefix(kl.claims.KiteID, kitekey.AgentIDPrefix) {
		return errors.New("--vagrant needs its owner's kite key (kloud key create), not a machine's agent key: a machine's agent is never a vagrant host")
	}
	home := o.Home
	if home == "" {
		home = filepath.Join(kl.opts.StateDir, "vagrant")
	}
	m, err := vagrant.New(vagrant.Options{Home: home, Vagrant: o.Binary, Env: o.Env, Logger: kl.log.With("component", "vagrant")})
	if err != nil {
		return err
	}
	kl.vagrant = m
	kl.kite.Handle(klientapi.MethodVagrantCreate, kite.Typed(kl.vagrantCreate))
	kl.kite.Handle(klientapi.MethodVagrantUp, kite.Typed(kl.vagrantOp(m.Up, true)))
	kl.kite.Handle(klientapi.MethodVagrantHalt, kite.Typed(kl.vagrantOp(m.Halt, true)))
	kl.kite.Handle(klientapi.MethodVagrantStatus, kite.Typed(kl.vagrantOp(m.Status, false)))
	kl.kite.Handle(klientapi.MethodVagrantDestroy, kite.Typed(kl.vagrantDestroy))
	kl.kite.Handle(klientapi.MethodVagrantList, kite.Typed(kl.vagrantList))
	kl.kite.Handle(klientapi.MethodVagrantInfo, kite.Typed(kl.vagrantInfo))
	kl.handleVagrantSnapshots() // vagrant_snapshot.go
	return nil
}

// ownerOnly verifies that token is a token of the owner for this klient.
func (kl *Klient) ownerOnly(ctx context.Context, r *kite.Request, token string) error {
	c, err := kl.verifier.Token(ctx, token, kl.claims.KiteID)
	if err != nil {
		return fmt.Errorf("%s: %w", r.Method, err)
	}
	if c.Subject != kl.opts.Owner {
		return fmt.Errorf("%s: this vagrant host is %s's, the token is %s's: %w", r.Method, kl.opts.Owner, c.Subject, kite.ErrPermission)
	}
	if !r.Conn.Dialed() {
		if p := r.Principal(); p == nil || p.Username != c.Subject {
			return fmt.Errorf("%s: the token is %s's, not the caller's: %w", r.Method, c.Subject, kite.ErrPermission)
		}
	}
	return nil
}

// vagrantErr adds kite codes to the manager's errors.
func vagrantErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, vagrant.ErrNotFound), errors.Is(err, vagrant.ErrSnapshotNotFound):
		return fmt.Errorf("%w: %w", err, kite.ErrNotFound)
	case errors.Is(err, vagrant.ErrExists):
		return fmt.Errorf("%w: %w", err, kite.ErrConflict)
	case errors.Is(err, vagrant.ErrRunning), errors.Is(err, vagrant.ErrUnsupported):
		return fmt.Errorf("%w: %w", err, kite.ErrState)
	case errors.Is(err, layersnap.ErrMismatch):
		return fmt.Errorf("%w: %w", err, kite.ErrInvalidParams)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%w: %w", err, kite.ErrTimeout)
	}
	return err
}

func (kl *Klient) vagrantCreate(ctx context.Context, r *kite.Request, p *klientapi.VagrantCreateParams) (any, error) {
	if err := kl.ownerOnly(ctx, r, p.Token); err != nil {
		return nil, err
	}
	vm, err := kl.vagrant.Create(ctx, *p)
	return vm, vagrantErr(err)
}

// MaxVagrantOp bounds a vagrant up, halt or destroy (a first up may download a box).
const MaxVagrantOp = 30 * time.Minute

// detached is the context of a vagrant command that changes a machine: it does not end when the
// caller goes away (kloud restarting, a dropped link), because a `vagrant up` killed halfway can
// leave a container Vagrant does not know about; it ends when klient stops or after MaxVagrantOp.
// The caller gets its answer, or its own error; the machine's state stays Vagrant's.
func (kl *Klient) detached(ctx context.Context) (context.Context, context.CancelFunc) {
	d, cancel := context.WithTimeout(context.WithoutCancel(ctx), MaxVagrantOp)
	stop := context.AfterFunc(kl.ctx, cancel)
	return d, func() { stop(); cancel() }
}

func (kl *Klient) vagrantOp(op func(context.Context, string) (klientapi.VagrantMachine, error), changes bool) func(context.Context, *kite.Request, *klientapi.VagrantNameParams) (any, error) {
	return func(ctx context.Context, r *kite.Request, p *klientapi.VagrantNameParams) (any, error) {
		if err := kl.ownerOnly(ctx, r, p.Token); err != nil {
			return nil, err
		}
		if changes {
			var cancel context.CancelFunc
			ctx, cancel = kl.detached(ctx)
			defer cancel()
		}
		vm, err := op(ctx, p.Name)
		return vm, vagrantErr(err)
	}
}

func (kl *Klient) vagrantDestroy(ctx context.Context, r *kite.Request, p *klientapi.VagrantNameParams) (any, error) {
	if err := kl.ownerOnly(ctx, r, p.Token); err != nil {
		return nil, err
	}
	ctx, cancel := kl.detached(ctx)
	defer cancel()
	return struct{}{}, vagrantErr(kl.vagrant.Destroy(ctx, p.Name))
}

func (kl *Klient) vagrantList(ctx context.Context, r *kite.Request, p *klientapi.VagrantListParams) (any, error) {
	if err := kl.ownerOnly(ctx, r, p.Token); err != nil {
		return nil, err
	}
	ms, err := kl.vagrant.List(ctx)
	if err != nil {
		return nil, vagrantErr(err)
	}
	return klientapi.VagrantListResult{Machines: ms}, nil
}

func (kl *Klient) vagrantInfo(ctx context.Context, r *kite.Request, p *klientapi.VagrantInfoParams) (any, error) {
	if err := kl.ownerOnly(ctx, r, p.Token); err != nil {
		return nil, err
	}
	return kl.vagrant.Info()
}
