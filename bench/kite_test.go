package bench_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/bench/internal/measure"
	"github.com/kloud-dev/kloud/bench/p1"
)

// BenchmarkRoundTrip is P1 as Go benchmarks: raw coder/websocket echo and kite call, each
// sequential (with p50/p99 metrics) and with 32 callers in flight on one connection (calls/s).
// For the side-by-side ratios run bench/cmd/p1; use this one with -cpuprofile and friends:
//
//	go test ./bench -run '^$' -bench 'RoundTrip/kite' -cpuprofile /tmp/kite.cpu
func BenchmarkRoundTrip(b *testing.B) {
	starts := []struct {
		name  string
		start func(b *testing.B) p1.Target
	}{
		{"raw", func(b *testing.B) p1.Target {
			t, err := p1.StartRaw(b.Context())
			if err != nil {
				b.Fatal(err)
			}
			return t
		}},
		{"kite", func(b *testing.B) p1.Target {
			t, err := p1.StartKite(b.Context(), b.TempDir())
			if err != nil {
				b.Fatal(err)
			}
			return t
		}},
	}
	for _, s := range starts {
		b.Run(s.name+"/seq", func(b *testing.B) {
			t := s.start(b)
			defer t.Close()
			d := make([]time.Duration, 0, 1<<16)
			for b.Loop() {
				start := time.Now()
				if err := t.Call(b.Context()); err != nil {
					b.Fatal(err)
				}
				d = append(d, time.Since(start))
			}
			l := measure.Summarize(d)
			b.ReportMetric(float64(l.P50.Nanoseconds()), "p50-ns")
			b.ReportMetric(float64(l.P99.Nanoseconds()), "p99-ns")
		})
		for _, callers := range []int{32} {
			b.Run(fmt.Sprintf("%s/inflight%d", s.name, callers), func(b *testing.B) {
				t := s.start(b)
				defer t.Close()
				var left atomic.Int64
				left.Store(int64(b.N))
				b.ResetTimer()
				start := time.Now()
				var wg sync.WaitGroup
				for range callers {
					wg.Go(func() {
						for left.Add(-1) >= 0 {
							if err := t.Call(b.Context()); err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
				wg.Wait()
				b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "calls/s")
			})
		}
	}
}
