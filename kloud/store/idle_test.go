package store_test

import (
	"testing"
	"time"

	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/provider"
)

// TestIdleCountdown: a machine's idle countdown is written only while the machine is in the
// state the writer saw and never moved back by a slower writer; settings replace the machine's
// own and restart the countdown; none of it changes updatedAt (which shares are keyed on); a
// start resets it. A template's settings are set and dropped whole.
func TestIdleCountdown(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, b backend) {
		ctx := ctxT(t)
		s := b.open(t, store.Options{})
		ms := s.Machines()
		if err := ms.InsertMany(ctx, []model.Machine{{ID: "m1", StackID: "s1", Label: "vm", State: provider.Running, Owner: "alice"}}); err != nil {
			t.Fatal(err)
		}
		before, _ := ms.Get(ctx, "m1")
		t0 := s.Now()
		get := func() model.Machine {
			t.Helper()
			m, err := ms.Get(ctx, "m1")
			if err != nil {
				t.Fatal(err)
			}
			return m
		}
		if ok, err := ms.SetIdleCountdown(ctx, "m1", string(provider.Running), t0, t0.Add(time.Hour)); err != nil || !ok {
			t.Fatalf("first countdown: %v %v", ok, err)
		}
		if m := get(); !m.Idle.LastActivity.Equal(t0) || !m.Idle.Deadline.Equal(t0.Add(time.Hour)) || !m.UpdatedAt.Equal(before.UpdatedAt) {
			t.Fatalf("after the first countdown: %+v, updatedAt %s (was %s)", m.Idle, m.UpdatedAt, before.UpdatedAt)
		}
		// A slower writer with older activity, or one that saw another state, writes nothing.
		if ok, err := ms.SetIdleCountdown(ctx, "m1", string(provider.Running), t0.Add(-time.Minute), t0.Add(59*time.Minute)); err != nil || ok {
			t.Fatalf("older activity written: %v %v", ok, err)
		}
		if ok, err := ms.SetIdleCountdown(ctx, "m1", string(provider.Stopped), t0.Add(time.Minute), t0.Add(61*time.Minute)); err != nil || ok {
			t.Fatalf("written for a state the machine is not in: %v %v", ok, err)
		}
		if m := get(); !m.Idle.LastActivity.Equal(t0) {
			t.Fatalf("last activity moved: %+v", m.Idle)
		}
		// Newer activity moves it; a zero deadline ends the countdown.
		if ok, err := ms.SetIdleCountdown(ctx, "m1", string(provider.Running), t0.Add(time.Minute), time.Time{}); err != nil || !ok {
			t.Fatalf("newer activity: %v %v", ok, err)
		}
		if m := get(); !m.Idle.LastActivity.Equal(t0.Add(time.Minute)) || !m.Idle.Deadline.IsZero() {
			t.Fatalf("after the newer activity: %+v", m.Idle)
		}
		// Settings replace the machine's own and clear the deadline.
		ms.SetIdleCountdown(ctx, "m1", string(provider.Running), t0.Add(time.Minute), t0.Add(2*time.Hour))
		timeout, on := int64(1800), true
		if err := ms.SetIdleSettings(ctx, "m1", model.IdleSettings{TimeoutSeconds: &timeout, AlwaysOn: &on}); err != nil {
			t.Fatal(err)
		}
		if m := get(); m.Idle.TimeoutSeconds == nil || *m.Idle.TimeoutSeconds != 1800 || m.Idle.AlwaysOn == nil || !*m.Idle.AlwaysOn || !m.Idle.Deadline.IsZero() {
			t.Fatalf("after the settings: %+v", m.Idle)
		}
		if err := ms.SetIdleSettings(ctx, "m1", model.IdleSettings{}); err != nil {
			t.Fatal(err)
		}
		if m := get(); m.Idle.TimeoutSeconds != nil || m.Idle.AlwaysOn != nil || !m.UpdatedAt.Equal(before.UpdatedAt) {
			t.Fatalf("after dropping the settings: %+v", m)
		}
		// A start resets it.
		ms.SetIdleCountdown(ctx, "m1", string(provider.Running), t0.Add(time.Hour), t0.Add(2*time.Hour))
		if err := ms.ResetIdleCountdown(ctx, "m1", t0.Add(3*time.Hour)); err != nil {
			t.Fatal(err)
		}
		if m := get(); !m.Idle.LastActivity.Equal(t0.Add(3*time.Hour)) || !m.Idle.Deadline.IsZero() {
			t.Fatalf("after the reset: %+v", m.Idle)
		}

		// Templates.
		if err := s.Templates().Insert(ctx, model.Template{ID: "t1", Title: "t", Team: "default", Owner: "alice", Rev: 1}); err != nil {
			t.Fatal(err)
		}
		if err := s.Templates().SetIdle(ctx, "t1", model.IdleSettings{TimeoutSeconds: &timeout}); err != nil {
			t.Fatal(err)
		}
		if tp, err := s.Templates().Get(ctx, "t1"); err != nil || tp.Idle.TimeoutSeconds == nil || *tp.Idle.TimeoutSeconds != 1800 || tp.Idle.AlwaysOn != nil {
			t.Fatalf("template's idle: %+v %v", tp.Idle, err)
		}
		if err := s.Templates().SetIdle(ctx, "t1", model.IdleSettings{}); err != nil {
			t.Fatal(err)
		}
		if tp, _ := s.Templates().Get(ctx, "t1"); tp.Idle != (model.IdleSettings{}) {
			t.Fatalf("template's idle after dropping it: %+v", tp.Idle)
		}
	})
}
