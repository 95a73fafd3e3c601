package vagrant

import (
	"context"
	"errors"
	"fmt"
	"io/fs"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/klient/klientapi"
	"github.com/kloud-dev/kloud/provider"
)

// machine is one vagrant machine as kloud controls it, outside Terraform: through its host.
type machine struct {
	v   *Vagrant
	rec *record
	b   *provider.BaseMachine
	// gone: kloud has no record of it (destroyed): only its snapshots, on the host its
	// attributes name, can still be deleted (snapshot.go); everything else is ErrNotFound.
	gone bool
}

func (v *Vagrant) machine(b *provider.BaseMachine) (provider.Machine, error) {
	name, _ := b.Attributes["id"].(string)
	if name == "" {
		return nil, fmt.Errorf("vagrant machine %s: no id in its Terraform state: %w", b.Label, kite.ErrState)
	}
	rec, err := v.readRecord(name)
	if errors.Is(err, fs.ErrNotExist) {
		host, _ := b.Attributes["host"].(string)
		if !machineNameRE.MatchString(name) || host == "" || b.Owner == "" {
			return nil, fmt.Errorf("vagrant machine %s (%s): kloud has no record of it: %w", b.Label, name, kite.ErrNotFound)
		}
		return &machine{v: v, rec: &record{Name: name, Host: host, Owner: b.Owner}, b: b, gone: true}, nil
	}
	if err != nil {
		return nil, err
	}
	if rec.Owner != b.Owner || rec.Tags[TagMachine] != b.ID {
		return nil, fmt.Errorf("vagrant machine %s (%s) is recorded as another machine's: %w", b.Label, name, kite.ErrPermission)
	}
	return &machine{v: v, rec: rec, b: b}, nil
}

func (m *machine) meta(vm klientapi.VagrantMachine) map[string]any {
	return map[string]any{"machine_id": m.rec.Name, "host": m.rec.Host, "vagrant_state": vm.State}
}

func (m *machine) goneErr() error {
	return fmt.Errorf("vagrant machine %s (%s): kloud has no record of it: %w", m.b.Label, m.rec.Name, kite.ErrNotFound)
}

func (m *machine) op(ctx context.Context, method string) (klientapi.VagrantMachine, error) {
	if m.gone {
		return klientapi.VagrantMachine{}, m.goneErr()
	}
	h, err := m.v.hosts.Host(ctx, m.rec.Owner, m.rec.Host)
	if err != nil {
		return klientapi.VagrantMachine{}, fmt.Errorf("vagrant machine %s: %w", m.b.Label, err)
	}
	var vm klientapi.VagrantMachine
	if err := m.v.call(ctx, h, method, klientapi.VagrantNameParams{Token: h.Token, Name: m.rec.Name}, &vm); err != nil {
		return vm, fmt.Errorf("vagrant machine %s: %w", m.b.Label, err)
	}
	return vm, nil
}

// Start boots the machine again on its disk (`vagrant up` on its host).
func (m *machine) Start(ctx context.Context) (any, error) {
	vm, err := m.op(ctx, klientapi.MethodVagrantUp)
	if err != nil {
		return nil, err
	}
	return m.meta(vm), nil
}

// Stop halts the machine and keeps its disk (`vagrant halt`).
func (m *machine) Stop(ctx context.Context) (any, error) {
	vm, err := m.op(ctx, klientapi.MethodVagrantHalt)
	if err != nil {
		return nil, err
	}
	return m.meta(vm), nil
}

// Info maps Vagrant's state: running → Running, stopped → Stopped, absent or never created →
// Terminated; a host that is not connected is an error (the state is unknown).
func (m *machine) Info(ctx context.Context) (provider.State, any, error) {
	vm, err := m.op(ctx, klientapi.MethodVagrantStatus)
	if err != nil {
		return provider.Unknown, nil, err
	}
	switch vm.State {
	case klientapi.VagrantRunning:
		return provider.Running, m.meta(vm), nil
	case klientapi.VagrantStopped:
		return provider.Stopped, m.meta(vm), nil
	case klientapi.VagrantAbsent, klientapi.VagrantNotCreated:
		return provider.Terminated, nil, nil
	}
	return provider.Unknown, m.meta(vm), nil
}

var _ provider.Machine = (*machine)(nil)
