package webterm

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Viewer is one attachment to a session: a bounded queue of the session's output for one
// consumer, and (unless it is read-only) a way to type into it. Get one from Manager.Open;
// consume with Next; Close detaches (the session lives on).
type Viewer struct {
	s        *Session
	user     string
	mode     string
	readonly bool
	since    time.Time

	mu     sync.Mutex
	q      [][]byte // queued output; q[0][off:] is next
	off    int
	queued int
	closed bool
	end    *EndError
	wake   chan struct{} // cap 1: output or the end for the consumer
	space  chan struct{} // cap 1: the queue went below its limit
	done   chan struct{}
}

// EndError is why a viewer ended: a WebSocket close code (Close* constants) and a reason for
// people.
type EndError struct {
	Code   int
	Reason string
}

func (e *EndError) Error() string { return fmt.Sprintf("%s (%d)", e.Reason, e.Code) }

func newViewer(s *Session, user, mode string, replay []byte) *Viewer {
	v := &Viewer{s: s, user: user, mode: mode, readonly: mode == ModeReadonly, since: time.Now(),
		wake: make(chan struct{}, 1), space: make(chan struct{}, 1), done: make(chan struct{})}
	if len(replay) > 0 {
		v.q, v.queued = [][]byte{replay}, len(replay)
		v.wake <- struct{}{}
	}
	return v
}

// Session returns the id of the viewer's session.
func (v *Viewer) Session() string { return v.s.id }

// Mode is the mode it attached with (ModeReadonly viewers cannot type or resize).
func (v *Viewer) Mode() string { return v.mode }

// RunAs is the machine account the viewer's session runs as.
func (v *Viewer) RunAs() string { return v.s.runAs }

// ReadOnly reports whether the viewer may only watch.
func (v *Viewer) ReadOnly() bool { return v.readonly }

// Done is closed when the viewer has ended (detached, dropped or its session ended).
func (v *Viewer) Done() <-chan struct{} { return v.done }

// Err returns why the viewer ended, or nil while it is attached.
func (v *Viewer) Err() *EndError {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.end
}

// Queued returns how many bytes of output wait for the consumer.
func (v *Viewer) Queued() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.queued
}

// Next copies queued output into buf, waiting for some if there is none. After the viewer
// ended and its queue is drained (a dropped viewer's queue is discarded), it returns the
// *EndError.
func (v *Viewer) Next(ctx context.Context, buf []byte) (int, error) {
	for {
		v.mu.Lock()
		if v.queued > 0 {
			n := 0
			for n < len(buf) && len(v.q) > 0 {
				k := copy(buf[n:], v.q[0][v.off:])
				n += k
				v.off += k
				if v.off == len(v.q[0]) {
					v.q[0] = nil
					v.q = v.q[1:]
					v.off = 0
				}
			}
			before := v.queued
			v.queued -= n
			if len(v.q) == 0 {
				v.q = nil // let the backing array go
			}
			if before >= v.s.m.opts.ViewerQueue && v.queued < v.s.m.opts.ViewerQueue {
				select {
				case v.space <- struct{}{}:
				default:
				}
			}
			if v.queued > 0 {
				select { // more is waiting: keep the wake-up for the next call
				case v.wake <- struct{}{}:
				default:
				}
			}
			v.mu.Unlock()
			return n, nil
		}
		if v.closed {
			end := v.end
			v.mu.Unlock()
			return 0, end
		}
		v.mu.Unlock()
		select {
		case <-v.wake:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// push queues output for the viewer. While the queue is full it waits, at most until deadline;
// a viewer still full then is dropped (CloseTooSlow), so one slow viewer cannot hold the
// session's output back for longer. It reports whether the viewer took p.
func (v *Viewer) push(p []byte, deadline time.Time) bool {
	limit := v.s.m.opts.ViewerQueue
	var timer *time.Timer
	v.mu.Lock()
	for v.queued >= limit && !v.closed {
		v.mu.Unlock()
		if timer == nil {
			timer = time.NewTimer(time.Until(deadline))
			defer timer.Stop()
		}
		select {
		case <-v.space:
		case <-v.done:
		case <-v.s.closing: // the session is ending: stop waiting
			return false
		case <-timer.C:
			v.close(CloseTooSlow, fmt.Sprintf("too slow: %d KiB of output not taken for %s", v.Queued()>>10, v.s.m.opts.SlowViewerTimeout), true)
			return false
		}
		v.mu.Lock()
	}
	if v.closed {
		v.mu.Unlock()
		return false
	}
	v.q = append(v.q, p)
	v.queued += len(p)
	v.mu.Unlock()
	select {
	case v.wake <- struct{}{}:
	default:
	}
	return true
}

// Input types p into the session. Read-only viewers get an error wrapping kite.ErrPermission.
func (v *Viewer) Input(p []byte) error {
	if v.readonly {
		return errReadOnly
	}
	select {
	case <-v.done:
		return v.Err()
	default:
	}
	return v.s.input(p)
}

// Resize sets the session's terminal size (the last writer to resize wins). Read-only viewers
// get an error wrapping kite.ErrPermission.
func (v *Viewer) Resize(cols, rows int) error {
	if v.readonly {
		return errReadOnly
	}
	return v.s.Resize(cols, rows)
}

// Close detaches the viewer. The session lives on.
func (v *Viewer) Close() { v.close(CloseNormal, "detached", true) }

// close ends the viewer with code and reason; discard drops output not yet consumed (a
// session that ended keeps it, so its last words still reach the viewer).
func (v *Viewer) close(code int, reason string, discard bool) {
	v.mu.Lock()
	if v.closed {
		v.mu.Unlock()
		return
	}
	v.closed = true
	v.end = &EndError{Code: code, Reason: reason}
	if discard {
		v.q, v.off, v.queued = nil, 0, 0
	}
	close(v.done)
	v.mu.Unlock()
	select {
	case v.wake <- struct{}{}:
	default:
	}
	v.s.detach(v)
}
