package store

import (
	"context"
	"sync"
	"time"
)

// DefaultProgressInterval is how often a [ProgressWriter] writes at most, by default.
const DefaultProgressInterval = 250 * time.Millisecond

// ProgressWriter coalesces one job's progress updates. A Terraform run reports hundreds of
// events; writing each as a [Jobs.Progress] would rewrite the job's document (log included)
// hundreds of times. Set keeps the latest value in memory and writes it at most every interval,
// at once when the stage or the message changes (a new step of the job: "Checking machines'
// agents") or the percentage reaches 100, and a value kept back (the same step, a new
// percentage: Terraform's events) is
// written when the interval is up (a timer) or at [ProgressWriter.Flush], which the job's runner
// calls before it finishes the job: the last value set is always written.
//
// Writes go through write (typically [Jobs.Progress] wrapped in [Store.Persist]); they are
// serialised, and an older value is never written after a newer one.
type ProgressWriter struct {
	write    func(ctx context.Context, p Progress) error
	interval time.Duration

	mu      sync.Mutex
	seq     uint64   // of the latest value set
	pending Progress // the latest value, if seq > written
	last    time.Time
	step    [2]string // stage and message of the last value written (or being written)
	timer   *time.Timer

	wmu     sync.Mutex // held while writing
	written uint64     // seq of the last value written
}

// Progress is one progress value of a job.
type Progress struct {
	Percent int
	Stage   string
	Message string
}

// NewProgressWriter returns a writer that writes through write at most every interval
// (0: [DefaultProgressInterval]).
func NewProgressWriter(interval time.Duration, write func(ctx context.Context, p Progress) error) *ProgressWriter {
	if interval <= 0 {
		interval = DefaultProgressInterval
	}
	return &ProgressWriter{write: write, interval: interval}
}

// Set records p. It writes p now (and returns the write's error) if its stage or message differ
// from the last write's, if p.Percent is 100 or more, or if the last write is at least an
// interval old; otherwise it keeps p to be written within the interval and returns nil.
func (w *ProgressWriter) Set(ctx context.Context, p Progress) error {
	w.mu.Lock()
	w.seq++
	w.pending = p
	now := time.Now()
	due := w.last.Add(w.interval)
	if [2]string{p.Stage, p.Message} != w.step || p.Percent >= 100 || !now.Before(due) {
		w.mu.Unlock()
		return w.Flush(ctx)
	}
	if w.timer == nil {
		w.timer = time.AfterFunc(due.Sub(now), func() {
			w.mu.Lock()
			w.timer = nil
			w.mu.Unlock()
			// The job's context may be gone by now; the write is bookkeeping and write
			// brings its own retries and timeout.
			_ = w.Flush(context.Background())
		})
	}
	w.mu.Unlock()
	return nil
}

// Flush writes the latest value set if it was not written yet.
func (w *ProgressWriter) Flush(ctx context.Context) error {
	w.wmu.Lock()
	defer w.wmu.Unlock()
	w.mu.Lock()
	seq, p := w.seq, w.pending
	if seq == w.written {
		w.mu.Unlock()
		return nil
	}
	w.last, w.step = time.Now(), [2]string{p.Stage, p.Message}
	w.mu.Unlock()
	err := w.write(ctx, p)
	if err == nil {
		w.written = seq
	}
	return err
}

// Stop cancels a pending timer (the caller flushes first if it wants the value written).
func (w *ProgressWriter) Stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.timer != nil {
		w.timer.Stop()
		w.timer = nil
	}
}
