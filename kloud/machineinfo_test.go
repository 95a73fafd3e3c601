package kloud_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/provider"
)

// slowInfoMachine is a machine whose provider answers Info only once the test lets it: Stopped
// (it was stopped behind kloud's back).
type slowInfoMachine struct {
	calls   *atomic.Int32
	release chan struct{}
}

func (slowInfoMachine) Start(context.Context) (any, error) {
	return nil, errors.New("must not be called")
}
func (slowInfoMachine) Stop(context.Context) (any, error) {
	return nil, errors.New("must not be called")
}

func (m slowInfoMachine) Info(ctx context.Context) (provider.State, any, error) {
	m.calls.Add(1)
	select {
	case <-m.release:
		return provider.Stopped, nil, nil
	case <-ctx.Done():
		return provider.Unknown, nil, ctx.Err()
	}
}

// TestMachineInfoSlowProvider: a provider slower than machine.info waits for (vagrant status on
// a loaded host) → every machine.info answers within the wait with what kloud knows and why the
// provider's part is missing; the callers meanwhile share one Info; when the provider answers
// later, kloud records it (the store says Stopped, reconciled), and the next machine.info shows
// it. Before, each call gave up after 20s and dropped the provider's answer, so a machine
// stopped behind kloud's back was never seen as stopped while the provider took longer (ci45:
// vagrant's InfoBehindBack).
func TestMachineInfoSlowProvider(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	release := make(chan struct{})
	reg := provider.NewRegistry()
	reg.Register(&provider.Provider{Name: "slowinfo", ResourceType: "slowinfo_machine",
		Capabilities: []provider.Capability{provider.CapInfo},
		Machine: func(*provider.BaseMachine) (provider.Machine, error) {
			return slowInfoMachine{calls: &calls, release: release}, nil
		}})
	w := newUserWorld(t, kloudtest.Options{Providers: reg})
	kloud.SetMachineInfoWait(w.e.Server, 500*time.Millisecond)
	released := sync.OnceFunc(func() { close(release) })
	t.Cleanup(released)
	w.addUser("alice", "", false)
	ctx := t.Context()
	now := time.Now()
	if err := w.e.Server.Store().Machines().InsertMany(ctx, []model.Machine{{ID: "m1", StackID: "s1", Label: "web", Provider: "slowinfo",
		Owner: "alice", Team: model.DefaultTeam, State: provider.Running, CreatedAt: now, UpdatedAt: now}}); err != nil {
		t.Fatal(err)
	}
	c := api.NewClient(w.as("alice"))

	// Three callers at once, and one after them: each is answered after the wait, with what
	// kloud knows; the provider was asked once.
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 3 {
		wg.Go(func() {
			info, err := c.MachineInfo(ctx, api.MachineRef{MachineID: "m1"})
			if err == nil && (info.State != provider.Running || !strings.Contains(info.InfoError, "did not answer within 500ms")) {
				err = errors.New("machine.info: " + string(info.State) + " " + info.InfoError)
			}
			errs <- err
		})
	}
	wg.Wait()
	info, err := c.MachineInfo(ctx, api.MachineRef{MachineID: "m1"})
	if err == nil && (info.State != provider.Running || !strings.Contains(info.InfoError, "machine.info shows its answer once it came")) {
		err = errors.New("machine.info: " + string(info.State) + " " + info.InfoError)
	}
	errs <- err
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("the provider's Info was called %d times for 4 machine.info calls while it had not answered, want 1", n)
	}

	// The provider answers, with no call waiting: kloud records it.
	released()
	testutil.Eventually(t, 10*time.Second, func() bool {
		m, err := w.e.Server.Store().Machines().Get(ctx, "m1")
		return err == nil && m.State == provider.Stopped && m.Reason == "reconciled with the provider"
	}, "the provider's late answer was not recorded")
	info, err = c.MachineInfo(ctx, api.MachineRef{MachineID: "m1"})
	if err != nil || info.State != provider.Stopped || info.InfraState != provider.Stopped || info.InfoError != "" {
		t.Fatalf("machine.info after the provider answered: %+v %v", info, err)
	}
}
