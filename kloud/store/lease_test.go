package store_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/kloud/store"
)

func TestLeaseExactlyOneWinner(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, b backend) {
		ctx := ctxT(t)
		clk := newClock()
		s := b.open(t, store.Options{Now: clk.Now})
		const racers, rounds = 8, 40
		for round := range rounds {
			name := fmt.Sprintf("stack/race-%d", round)
			if round%2 == 1 {
				// Odd rounds race to take over a lease whose holder died, the path that an
				// upsert's unique _id does not protect.
				if _, err := s.AcquireLease(ctx, name, "dead", time.Second); err != nil {
					t.Fatal(err)
				}
				clk.Advance(2 * time.Second)
			}
			var (
				wg      sync.WaitGroup
				mu      sync.Mutex
				winners []string
				errs    []error
			)
			start := make(chan struct{})
			for i := range racers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					owner := fmt.Sprintf("replica-%d", i)
					<-start
					_, err := s.AcquireLease(ctx, name, owner, time.Minute)
					mu.Lock()
					defer mu.Unlock()
					if err == nil {
						winners = append(winners, owner)
					} else {
						errs = append(errs, err)
					}
				}()
			}
			close(start)
			wg.Wait()
			if len(winners) != 1 {
				t.Fatalf("round %d: %d winners %v, want 1 (errors %v)", round, len(winners), winners, errs)
			}
			for _, err := range errs {
				if !errors.Is(err, store.ErrLocked) || !strings.Contains(err.Error(), winners[0]) {
					t.Fatalf("round %d: loser error %v, want ErrLocked naming %s", round, err, winners[0])
				}
			}
			h, err := s.LeaseHolder(ctx, name)
			if err != nil || h.Owner != winners[0] {
				t.Fatalf("round %d: holder %+v %v, want %s", round, h, err, winners[0])
			}
		}
		if n, err := s.PruneLeases(ctx, s.Now().Add(time.Hour), store.PruneOptions{}); err != nil || n != rounds {
			t.Fatalf("prune: %d %v, want %d", n, err, rounds)
		}
	})
}

func TestLeaseExpiryRenewRelease(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, b backend) {
		ctx := ctxT(t)
		clk := newClock()
		s := b.open(t, store.Options{Now: clk.Now})

		a, err := s.AcquireLease(ctx, "machine/m1", "A", 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if !a.ExpiresAt.Equal(clk.Now().Add(10 * time.Second)) {
			t.Fatalf("expires %v", a.ExpiresAt)
		}
		// Re-entrant for the owner: extends, keeps AcquiredAt.
		clk.Advance(time.Second)
		a2, err := s.AcquireLease(ctx, "machine/m1", "A", 10*time.Second)
		if err != nil || !a2.AcquiredAt.Equal(a.AcquiredAt) || !a2.ExpiresAt.Equal(clk.Now().Add(10*time.Second)) {
			t.Fatalf("re-acquire: %+v %v", a2, err)
		}
		_, err = s.AcquireLease(ctx, "machine/m1", "B", 10*time.Second)
		if !errors.Is(err, store.ErrLocked) || !strings.Contains(err.Error(), `"A"`) {
			t.Fatalf("B while A holds: %v", err)
		}
		t.Log(err)

		// Renew pushes expiry; B still locked out past the original expiry.
		clk.Advance(5 * time.Second)
		if err := a.Renew(ctx, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		clk.Advance(9 * time.Second)
		if _, err := s.AcquireLease(ctx, "machine/m1", "B", 10*time.Second); !errors.Is(err, store.ErrLocked) {
			t.Fatalf("B after renew: %v", err)
		}

		// A dies: after expiry B takes over; A can neither renew nor release any more.
		clk.Advance(2 * time.Second)
		if _, err := s.LeaseHolder(ctx, "machine/m1"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("holder of an expired lease: %v", err)
		}
		bl, err := s.AcquireLease(ctx, "machine/m1", "B", 10*time.Second)
		if err != nil {
			t.Fatalf("B after expiry: %v", err)
		}
		if !bl.AcquiredAt.Equal(clk.Now()) {
			t.Fatalf("takeover AcquiredAt %v, want now", bl.AcquiredAt)
		}
		if h, err := s.LeaseHolder(ctx, "machine/m1"); err != nil || h.Owner != "B" || !h.AcquiredAt.Equal(clk.Now()) {
			t.Fatalf("holder after takeover: %+v %v", h, err)
		}
		if err := a.Renew(ctx, time.Minute); !errors.Is(err, store.ErrLeaseLost) {
			t.Fatalf("A renews B's lease: %v", err)
		}
		if err := a.Release(ctx); !errors.Is(err, store.ErrLeaseLost) {
			t.Fatalf("A releases B's lease: %v", err)
		}
		if err := s.ReleaseLease(ctx, "machine/m1", "C"); !errors.Is(err, store.ErrLeaseLost) {
			t.Fatalf("C releases B's lease: %v", err)
		}
		if h, err := s.LeaseHolder(ctx, "machine/m1"); err != nil || h.Owner != "B" {
			t.Fatalf("holder after foreign releases: %+v %v", h, err)
		}

		// Release by the owner frees it at once.
		if err := bl.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := bl.Release(ctx); !errors.Is(err, store.ErrLeaseLost) {
			t.Fatalf("second release: %v", err)
		}
		if _, err := s.AcquireLease(ctx, "machine/m1", "C", time.Second); err != nil {
			t.Fatalf("C after release: %v", err)
		}
		if _, err := s.AcquireLease(ctx, "x", "A", 0); err == nil {
			t.Fatal("zero ttl accepted")
		}
	})
}
