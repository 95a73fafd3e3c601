// Package p1 measures a kite call round trip over loopback against a raw coder/websocket echo,
// in the same run, and prints the ratios (issue 2, "Measure", P1).
//
// Start with Run: it starts both targets once (StartRaw, StartKite), then for each round
// measures sequential round-trip latency (Latency) and calls per second with 1 and 32 callers
// in flight on one connection (Throughput), raw and kite alternating, and reports the median of
// the rounds. Both targets are one loopback connection that is safe for concurrent callers:
//
//   - raw: a coder/websocket echo server (reads a text frame, writes it back) and a client that
//     writes prebuilt frames and matches replies to callers by a fixed-width id in the frame
//     (one reader goroutine, one channel per call). No JSON is encoded or decoded: it is the
//     transport's ceiling.
//   - kite: a real kite.Kite serving "bench.echo" (returns its params) behind an httptest
//     server, and a client kite dialed with a real kite key (kitekey, Ed25519); each call is
//     Conn.Call with a params struct and decodes the result into one, as kites do.
package p1

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/google/uuid"

	"github.com/kloud-dev/kloud/bench/internal/measure"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
)

// Targets of issue 2.
const (
	TargetP50Ratio        = 1.5  // kite p50 / raw p50 at most
	TargetThroughputRatio = 0.60 // kite calls/s / raw calls/s at least
)

// Echo is the params (and result) of one bench.echo call: about the size of a small kite request
// such as kontrol.query by id.
type Echo struct {
	Kite string `json:"kite"`
	Seq  uint64 `json:"seq"`
	Text string `json:"text"`
}

// Payload is what every call carries.
var Payload = Echo{Kite: "bench", Seq: 1234567, Text: "a small payload, about one query by id: 0123456789abcdef"}

// Target is one loopback connection that callers share.
type Target interface {
	// Call does one round trip.
	Call(ctx context.Context) error
	// FrameSize is the size in bytes of one request frame on the wire (WebSocket payload).
	FrameSize() int
	Close() error
}

// --- raw coder/websocket echo ---

type rawTarget struct {
	hs     *httptest.Server
	ws     *websocket.Conn
	prefix []byte // `{"id":"`
	suffix []byte // `","method":"bench.echo","params":{...}}`
	next   atomic.Uint64

	mu      sync.Mutex
	pending map[uint64]chan error
	err     error
	done    chan struct{}
}

const rawIDLen = 16 // hex digits of the id, at a fixed offset so the reader finds it without parsing

// StartRaw starts a coder/websocket echo server on 127.0.0.1 and connects one client to it.
func StartRaw(ctx context.Context) (Target, error) {
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		c.SetReadLimit(4 << 20)
		ctx := context.Background()
		for {
			typ, b, err := c.Read(ctx)
			if err != nil {
				return
			}
			if err := c.Write(ctx, typ, b); err != nil {
				return
			}
		}
	}))
	ws, _, err := websocket.Dial(ctx, hs.URL, nil)
	if err != nil {
		hs.Close()
		return nil, fmt.Errorf("raw dial: %w", err)
	}
	ws.SetReadLimit(4 << 20)
	params, err := json.Marshal(Payload)
	if err != nil {
		return nil, fmt.Errorf("raw payload: %w", err)
	}
	t := &rawTarget{
		hs: hs, ws: ws,
		prefix:  []byte(`{"id":"`),
		suffix:  append([]byte(`","method":"bench.echo","params":`), append(params, '}')...),
		pending: map[uint64]chan error{},
		done:    make(chan struct{}),
	}
	go t.readLoop()
	return t, nil
}

func (t *rawTarget) FrameSize() int { return len(t.prefix) + rawIDLen + len(t.suffix) }

func (t *rawTarget) readLoop() {
	defer close(t.done)
	var err error
	for {
		var b []byte
		_, b, err = t.ws.Read(context.Background())
		if err != nil {
			break
		}
		var id [8]byte
		if len(b) < len(t.prefix)+rawIDLen {
			err = errors.New("raw: short reply")
			break
		}
		if _, err = hex.Decode(id[:], b[len(t.prefix):len(t.prefix)+rawIDLen]); err != nil {
			break
		}
		n := uint64(id[0])<<56 | uint64(id[1])<<48 | uint64(id[2])<<40 | uint64(id[3])<<32 |
			uint64(id[4])<<24 | uint64(id[5])<<16 | uint64(id[6])<<8 | uint64(id[7])
		t.mu.Lock()
		ch := t.pending[n]
		delete(t.pending, n)
		t.mu.Unlock()
		if ch != nil {
			ch <- nil
		}
	}
	t.mu.Lock()
	t.err = fmt.Errorf("raw read: %w", err)
	for n, ch := range t.pending {
		ch <- t.err
		delete(t.pending, n)
	}
	t.mu.Unlock()
}

func (t *rawTarget) Call(ctx context.Context) error {
	n := t.next.Add(1)
	frame := make([]byte, 0, t.FrameSize())
	frame = append(frame, t.prefix...)
	var id [8]byte
	for i := range id {
		id[i] = byte(n >> (56 - 8*i))
	}
	frame = hex.AppendEncode(frame, id[:])
	frame = append(frame, t.suffix...)
	ch := make(chan error, 1)
	t.mu.Lock()
	if t.err != nil {
		err := t.err
		t.mu.Unlock()
		return err
	}
	t.pending[n] = ch
	t.mu.Unlock()
	if err := t.ws.Write(ctx, websocket.MessageText, frame); err != nil {
		t.mu.Lock()
		delete(t.pending, n)
		t.mu.Unlock()
		return fmt.Errorf("raw write: %w", err)
	}
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		t.mu.Lock()
		delete(t.pending, n)
		t.mu.Unlock()
		return ctx.Err()
	}
}

func (t *rawTarget) Close() error {
	t.ws.Close(websocket.StatusNormalClosure, "")
	<-t.done
	t.hs.Close()
	return nil
}

// --- kite ---

type kiteTarget struct {
	hs       *httptest.Server
	server   *kite.Kite
	client   *kite.Kite
	conn     *kite.Conn
	dir      string
	reqBytes int
}

// StartKite starts a kite serving bench.echo behind an httptest server on 127.0.0.1 (its keyring
// in a temp dir under dir, "" for the system's) and dials it with a kite key it mints.
func StartKite(ctx context.Context, dir string) (_ Target, err error) {
	tmp, err := os.MkdirTemp(dir, "kloud-bench-p1-")
	if err != nil {
		return nil, fmt.Errorf("kite target: %w", err)
	}
	t := &kiteTarget{dir: tmp}
	defer func() {
		if err != nil {
			t.Close()
		}
	}()
	ring, err := kitekey.LoadOrCreateFileKeyring(filepath.Join(tmp, "keys.json"))
	if err != nil {
		return nil, fmt.Errorf("kite target: %w", err)
	}
	verifier := &kitekey.Verifier{Keys: ring.Keyring, Issuer: "kontrol"}
	t.server, err = kite.New(kite.Options{
		Identity:      kite.Identity{Name: "bench-server"},
		Authenticator: &kitekey.Authenticator{Verifier: verifier},
	})
	if err != nil {
		return nil, fmt.Errorf("kite target: %w", err)
	}
	t.server.HandleFunc("bench.echo", func(_ context.Context, r *kite.Request) (any, error) {
		return json.RawMessage(r.Params), nil
	})
	t.hs = httptest.NewServer(t.server)
	url := t.hs.URL + "/kite"
	signer := &kitekey.Signer{Current: ring.Current, Issuer: "kontrol"}
	key, err := signer.KiteKey("bench", uuid.NewString(), url)
	if err != nil {
		return nil, fmt.Errorf("kite target: %w", err)
	}
	t.client, err = kite.New(kite.Options{Identity: kite.Identity{Name: "bench-client"}})
	if err != nil {
		return nil, fmt.Errorf("kite target: %w", err)
	}
	t.conn, err = t.client.Dial(ctx, url, kite.Auth{Type: kite.AuthKiteKey, Key: key})
	if err != nil {
		return nil, fmt.Errorf("kite target: %w", err)
	}
	params, _ := json.Marshal(Payload)
	// What jsonrpc2 writes for a call: {"method":"bench.echo","params":...,"id":N,"jsonrpc":"2.0"}
	req, _ := json.Marshal(map[string]any{"method": "bench.echo", "params": json.RawMessage(params), "id": 1234567, "jsonrpc": "2.0"})
	t.reqBytes = len(req)
	return t, nil
}

func (t *kiteTarget) FrameSize() int { return t.reqBytes }

func (t *kiteTarget) Call(ctx context.Context) error {
	var res Echo
	if err := t.conn.Call(ctx, "bench.echo", &Payload, &res); err != nil {
		return err
	}
	if res.Seq != Payload.Seq {
		return fmt.Errorf("bench.echo: got seq %d, want %d", res.Seq, Payload.Seq)
	}
	return nil
}

func (t *kiteTarget) Close() error {
	if t.client != nil {
		t.client.Close()
	}
	if t.server != nil {
		t.server.Close()
	}
	if t.hs != nil {
		t.hs.Close()
	}
	return os.RemoveAll(t.dir)
}

// --- measurements ---

// Latency does warmup calls, then n sequential calls, timing each. It also returns the CPU time
// the process (client and server both) spent per call.
func Latency(ctx context.Context, t Target, warmup, n int) (measure.Latency, time.Duration, error) {
	for range warmup {
		if err := t.Call(ctx); err != nil {
			return measure.Latency{}, 0, err
		}
	}
	d := make([]time.Duration, n)
	cpu0 := measure.CPUTime()
	for i := range d {
		start := time.Now()
		if err := t.Call(ctx); err != nil {
			return measure.Latency{}, 0, err
		}
		d[i] = time.Since(start)
	}
	cpu := (measure.CPUTime() - cpu0) / time.Duration(n)
	return measure.Summarize(d), cpu, nil
}

// Throughput runs callers goroutines calling back to back on the one connection for d (after a
// warmup of d/10) and returns completed calls per second and the process's CPU time per call.
func Throughput(ctx context.Context, t Target, callers int, d time.Duration) (float64, time.Duration, error) {
	run := func(d time.Duration) (int64, time.Duration, error) {
		var count atomic.Int64
		var firstErr error
		var once sync.Once
		start := time.Now()
		deadline := start.Add(d)
		var wg sync.WaitGroup
		for range callers {
			wg.Go(func() {
				for time.Now().Before(deadline) {
					if err := t.Call(ctx); err != nil {
						once.Do(func() { firstErr = err })
						return
					}
					count.Add(1)
				}
			})
		}
		wg.Wait()
		return count.Load(), time.Since(start), firstErr
	}
	if _, _, err := run(d / 10); err != nil {
		return 0, 0, err
	}
	cpu0 := measure.CPUTime()
	n, el, err := run(d)
	if err != nil {
		return 0, 0, err
	}
	cpu := measure.CPUTime() - cpu0
	return float64(n) / el.Seconds(), cpu / time.Duration(max(n, 1)), nil
}

// Options configure Run. Zero fields take the documented defaults.
type Options struct {
	Rounds      int           // default 3; the report gives the median of the rounds
	Calls       int           // sequential calls timed per round (default 20000)
	Warmup      int           // untimed calls before them (default 2000)
	Duration    time.Duration // per throughput measurement (default 2s)
	Concurrency []int         // callers in flight for throughput (default 1 and 32)
	TempDir     string        // for the kite keyring ("" = the system's)
	Progress    io.Writer     // one line per measurement (nil = none)
}

func (o *Options) setDefaults() {
	if o.Rounds <= 0 {
		o.Rounds = 3
	}
	if o.Calls <= 0 {
		o.Calls = 20000
	}
	if o.Warmup <= 0 {
		o.Warmup = 2000
	}
	if o.Duration <= 0 {
		o.Duration = 2 * time.Second
	}
	if len(o.Concurrency) == 0 {
		o.Concurrency = []int{1, 32}
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
}

// Side is the figures of one target (medians over the rounds).
type Side struct {
	FrameSize int
	P50, P99  time.Duration
	Mean      time.Duration
	CallsPerS map[int]float64 // by callers in flight
	// CPU time of the whole process (both ends) per call: sequential, and by callers in flight.
	// Less moved by other load on the machine than the wall-clock figures.
	CPUSeq  time.Duration
	CPUPerC map[int]time.Duration
	Rounds  []measure.Latency
}

// Report is the outcome of Run.
type Report struct {
	Opts      Options
	Raw, Kite Side
	Started   time.Time
	Elapsed   time.Duration
	// LoadBefore and LoadAfter are /proc/loadavg around the run: other work on the machine.
	LoadBefore, LoadAfter string
}

// P50Ratio is kite p50 / raw p50.
func (r *Report) P50Ratio() float64 { return float64(r.Kite.P50) / float64(r.Raw.P50) }

// P99Ratio is kite p99 / raw p99.
func (r *Report) P99Ratio() float64 { return float64(r.Kite.P99) / float64(r.Raw.P99) }

// ThroughputRatio is kite calls/s / raw calls/s with n callers in flight.
func (r *Report) ThroughputRatio(n int) float64 { return r.Kite.CallsPerS[n] / r.Raw.CallsPerS[n] }

// Pass reports whether every target is met.
func (r *Report) Pass() bool {
	if r.P50Ratio() > TargetP50Ratio {
		return false
	}
	for _, n := range r.Opts.Concurrency {
		if r.ThroughputRatio(n) < TargetThroughputRatio {
			return false
		}
	}
	return true
}

// Run measures both targets, alternating them within each round.
func Run(ctx context.Context, opts Options) (*Report, error) {
	opts.setDefaults()
	rep := &Report{Opts: opts, Started: time.Now(), LoadBefore: measure.LoadAvg()}
	raw, err := StartRaw(ctx)
	if err != nil {
		return nil, err
	}
	defer raw.Close()
	kt, err := StartKite(ctx, opts.TempDir)
	if err != nil {
		return nil, err
	}
	defer kt.Close()
	type acc struct {
		p50, p99, mean, cpu []time.Duration
		cps                 map[int][]float64
		cpuc                map[int][]time.Duration
		rounds              []measure.Latency
	}
	sides := []struct {
		name string
		t    Target
		a    *acc
		out  *Side
	}{
		{"raw ", raw, &acc{cps: map[int][]float64{}, cpuc: map[int][]time.Duration{}}, &rep.Raw},
		{"kite", kt, &acc{cps: map[int][]float64{}, cpuc: map[int][]time.Duration{}}, &rep.Kite},
	}
	for round := 1; round <= opts.Rounds; round++ {
		for _, s := range sides {
			runtime.GC()
			l, cpu, err := Latency(ctx, s.t, opts.Warmup, opts.Calls)
			if err != nil {
				return nil, fmt.Errorf("%s latency: %w", s.name, err)
			}
			s.a.p50, s.a.p99, s.a.mean = append(s.a.p50, l.P50), append(s.a.p99, l.P99), append(s.a.mean, l.Mean)
			s.a.cpu = append(s.a.cpu, cpu)
			s.a.rounds = append(s.a.rounds, l)
			fmt.Fprintf(opts.Progress, "round %d %s: %d sequential calls p50 %s p99 %s\n", round, s.name, l.N, measure.Us(l.P50), measure.Us(l.P99))
			for _, n := range opts.Concurrency {
				runtime.GC()
				cps, cpu, err := Throughput(ctx, s.t, n, opts.Duration)
				if err != nil {
					return nil, fmt.Errorf("%s throughput with %d callers: %w", s.name, n, err)
				}
				s.a.cps[n] = append(s.a.cps[n], cps)
				s.a.cpuc[n] = append(s.a.cpuc[n], cpu)
				fmt.Fprintf(opts.Progress, "round %d %s: %2d in flight %8.0f calls/s\n", round, s.name, n, cps)
			}
		}
	}
	for _, s := range sides {
		*s.out = Side{
			FrameSize: s.t.FrameSize(),
			P50:       measure.MedianDuration(s.a.p50), P99: measure.MedianDuration(s.a.p99),
			Mean: measure.MedianDuration(s.a.mean), CallsPerS: map[int]float64{}, Rounds: s.a.rounds,
			CPUSeq: measure.MedianDuration(s.a.cpu), CPUPerC: map[int]time.Duration{},
		}
		for n, v := range s.a.cps {
			s.out.CallsPerS[n] = measure.Median(v)
			s.out.CPUPerC[n] = measure.MedianDuration(s.a.cpuc[n])
		}
	}
	rep.Elapsed = time.Since(rep.Started)
	rep.LoadAfter = measure.LoadAvg()
	return rep, nil
}

// Write prints the comparison.
func (r *Report) Write(w io.Writer) {
	verdict := func(ok bool) string {
		if ok {
			return "ok"
		}
		return "MISSED"
	}
	fmt.Fprintf(w, "P1: kite call round trip over loopback vs raw coder/websocket echo (same run)\n")
	fmt.Fprintf(w, "    %s, %d CPUs, GOMAXPROCS %d, %s; %d rounds (median), %d sequential calls/round, %s per throughput run\n",
		measure.CPUModel(), runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version(), r.Opts.Rounds, r.Opts.Calls, r.Opts.Duration)
	fmt.Fprintf(w, "    request frame: raw %d B, kite %d B\n", r.Raw.FrameSize, r.Kite.FrameSize)
	fmt.Fprintf(w, "%-24s %14s %14s %10s %10s\n", "", "raw ws", "kite", "kite/raw", "target")
	fmt.Fprintf(w, "%-24s %14s %14s %10.2f %10s\n", "round trip p50", measure.Us(r.Raw.P50), measure.Us(r.Kite.P50), r.P50Ratio(),
		fmt.Sprintf("≤ %.2f %s", TargetP50Ratio, verdict(r.P50Ratio() <= TargetP50Ratio)))
	fmt.Fprintf(w, "%-24s %14s %14s %10.2f\n", "round trip p99", measure.Us(r.Raw.P99), measure.Us(r.Kite.P99), r.P99Ratio())
	fmt.Fprintf(w, "%-24s %14s %14s %10.2f\n", "round trip mean", measure.Us(r.Raw.Mean), measure.Us(r.Kite.Mean), float64(r.Kite.Mean)/float64(r.Raw.Mean))
	for _, n := range r.Opts.Concurrency {
		ratio := r.ThroughputRatio(n)
		fmt.Fprintf(w, "%-24s %14.0f %14.0f %10.2f %10s\n", fmt.Sprintf("calls/s, %d in flight", n), r.Raw.CallsPerS[n], r.Kite.CallsPerS[n], ratio,
			fmt.Sprintf("≥ %.2f %s", TargetThroughputRatio, verdict(ratio >= TargetThroughputRatio)))
	}
	ratio := func(a, b time.Duration) float64 { return float64(a) / float64(b) }
	fmt.Fprintf(w, "%-24s %14s %14s %10.2f\n", "CPU per call, sequential", measure.Us(r.Raw.CPUSeq), measure.Us(r.Kite.CPUSeq), ratio(r.Kite.CPUSeq, r.Raw.CPUSeq))
	for _, n := range r.Opts.Concurrency {
		fmt.Fprintf(w, "%-24s %14s %14s %10.2f\n", fmt.Sprintf("CPU per call, %d in flight", n), measure.Us(r.Raw.CPUPerC[n]), measure.Us(r.Kite.CPUPerC[n]), ratio(r.Kite.CPUPerC[n], r.Raw.CPUPerC[n]))
	}
	fmt.Fprintf(w, "    (CPU = user+system time of the process, client and server ends together)\n")
	fmt.Fprintf(w, "    load average before %s, after %s\n", r.LoadBefore, r.LoadAfter)
	fmt.Fprintf(w, "P1 %s (%s)\n", map[bool]string{true: "PASS", false: "MISSED a target"}[r.Pass()], r.Elapsed.Round(time.Second))
}
