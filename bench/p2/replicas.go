package p2

// P2 across replicas (issue 24, "Measure"): RunReplicas. One `kloud store serve`, Options.Replicas
// `kloud serve --replicas --internal-url` processes on it (the same secret.key and instance id,
// as docs/deployment.md says), the simulated kites spread over them round robin; then one replica
// is SIGKILLed and its kites find the others, as klient's do behind a balancer.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kloud-dev/kloud/bench/internal/measure"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/kontrol"
)

// secretKeyFile and instanceIDFile are store.SecretKeyFile and the data dir's instance id: every
// replica must have the same ones (docs/deployment.md), and P2 does not link package kloud.
const (
	secretKeyFile  = "secret.key"
	instanceIDFile = "instance-id"
)

// ReplicasReport is the outcome of RunReplicas.
type ReplicasReport struct {
	Opts  Options
	Kloud string
	// Base holds the raw baseline (its Raw* fields), run first in the same process.
	Base Report
	Mint time.Duration // minting the kite keys on the replicas' admin connections (not timed)
	Reg  Phase         // kites started with kite.Client (dial, handshake, kontrol.register)
	// GenCPU is this process's CPU time during the registrations; RegCPU each replica's, and
	// StoreCPU the store server's.
	GenCPU, StoreCPU time.Duration
	RegCPU           []time.Duration
	Held             []int                // kites registered with each replica after the registrations
	Idle, Loaded     []measure.ProcStatus // each replica before the first kite and after the last
	StoreLoaded      measure.ProcStatus   // the store server after the registrations
	// Query is kontrol.query {query:{id}} for kites held by another replica, asked on a replica
	// that does not hold them (the id's kite is held by replica r, the query goes to r+1).
	Query    measure.Latency
	QueryErr string
	// Visible is how long after the registrations every kite was found by kontrol.query on a
	// replica that does not hold it (presence records are written in the background);
	// VisibleAfter the same for the moved kites after the failover.
	Visible, VisibleAfter       time.Duration
	VisibleErr, VisibleAfterErr string
	After                       []measure.ProcStatus // each replica after the queries

	// Failover: Killed is the replica SIGKILLed, KilledKites how many kites it held, Back how
	// many of them registered again on another replica within FailoverTimeout, Failover the time
	// from the kill to each one's kontrol.register reply there.
	Killed, KilledKites, Back int
	Failover                  measure.Latency
	// QueryAfter is kontrol.query for the moved kites, asked on the surviving replica that does
	// not hold them; AfterFail the survivors' memory then.
	QueryAfter    measure.Latency
	QueryAfterErr string
	AfterFail     []measure.ProcStatus
	Load          [2]string
	Start         time.Time
	Took          time.Duration
}

// The kites have machine agent keys (mintAgentKeys): kloud mirrors into the store's presence
// records (what another replica's kontrol.query reads) only kites whose id has the agent prefix
// (kloud/storeadapt.go storePresence). With Options.KiteKeys they have kontrol.createKey kite keys
// instead, and a query on a replica that does not hold the kite finds nothing.

// simKite is one simulated klient: its own kite.Kite, and a kite.Client (klient's reconnect:
// backoff with jitter, kontrol.register in OnConnect) to one of the replicas. urls is the order
// a balancer would try them in for this kite: when the replica refuses the connection (it is
// dead), the client is replaced by one to the next URL, as a balancer redispatches.
type simKite struct {
	k      *kite.Kite
	id     string
	key    string
	urls   []string
	idx    []int // replica index of each URL
	regCtx context.Context

	mu      sync.Mutex
	cl      *kite.Client
	at      int // index in urls of cl
	closed  bool
	lastErr error
	first   chan struct{} // closed at the first registration
	once    sync.Once

	holder atomic.Int32 // replica the kite registered with last (-1: none yet)
	regAt  atomic.Int64 // time of that registration's reply, unix ns
}

func (s *simKite) start(at int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.at = at
	replica := s.idx[at]
	var cl *kite.Client
	cl = s.k.NewClient(kite.ClientOptions{
		URL:  s.urls[at],
		Auth: func(context.Context) (kite.Auth, error) { return kite.Auth{Type: kite.AuthKiteKey, Key: s.key}, nil },
		OnConnect: func(ctx context.Context, c *kite.Conn) error {
			var res kontrol.RegisterResult
			if err := c.Call(ctx, "kontrol.register", kontrol.RegisterParams{}, &res); err != nil {
				return err
			}
			if res.Kite.Kite.ID != s.id {
				return fmt.Errorf("registered as %q, want %q", res.Kite.Kite.ID, s.id)
			}
			s.regAt.Store(time.Now().UnixNano())
			s.holder.Store(int32(replica))
			s.once.Do(func() { close(s.first) })
			return nil
		},
		OnError: func(err error) {
			s.mu.Lock()
			s.lastErr = err
			s.mu.Unlock()
			if errors.Is(err, syscall.ECONNREFUSED) || strings.Contains(err.Error(), "connection refused") {
				go s.next(cl)
			}
		},
		MaxBackoff: time.Second, // klient's reconnect ceiling (klient.go reconnectCeiling)
	})
	s.cl = cl
	cl.Start()
}

// next replaces cl (refused) by a client to the next URL.
func (s *simKite) next(cl *kite.Client) {
	s.mu.Lock()
	if s.closed || s.cl != cl {
		s.mu.Unlock()
		return
	}
	s.cl = nil
	at := (s.at + 1) % len(s.urls)
	s.mu.Unlock()
	cl.Close()
	s.start(at)
}

func (s *simKite) close() {
	s.mu.Lock()
	s.closed = true
	cl := s.cl
	s.cl = nil
	s.mu.Unlock()
	if cl != nil {
		cl.Close()
	}
	s.k.Close()
}

func (s *simKite) err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastErr
}

// replica is one `kloud serve --replicas` process.
type replica struct {
	p    *proc
	dir  string
	url  string // http://ADDR/kite
	adm  *kite.Kite
	ac   *kite.Conn
	dead bool
}

// RunReplicas runs P2 across Options.Replicas kloud replicas (default 3) on one store server,
// then kills one and measures the failover. Options.Server must be ServerBinary (the default).
func RunReplicas(ctx context.Context, opts Options) (rep *ReplicasReport, err error) {
	opts.setDefaults()
	if opts.Replicas <= 0 {
		opts.Replicas = 3
	}
	if opts.Replicas < 2 {
		return nil, errors.New("p2: replicas mode needs at least 2 replicas")
	}
	if opts.FailoverTimeout <= 0 {
		opts.FailoverTimeout = 3 * time.Minute
	}
	if opts.Server != ServerBinary || opts.Profile != "" {
		return nil, errors.New("p2: replicas mode runs `kloud serve` binaries only (no -server, no -profile)")
	}
	rep = &ReplicasReport{Opts: opts, Start: time.Now(), Killed: 0}
	rep.Load[0] = measure.LoadAvg()
	say := func(format string, args ...any) { fmt.Fprintf(opts.Progress, format+"\n", args...) }
	tmp, err := os.MkdirTemp(opts.TempDir, "kloud-bench-p2r-")
	if err != nil {
		return nil, fmt.Errorf("p2: %w", err)
	}
	if opts.Keep {
		say("temp dir (kept): %s", tmp)
	} else {
		defer os.RemoveAll(tmp)
	}
	if opts.Self == "" {
		if opts.Self, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("p2: %w", err)
		}
	}
	rep.Kloud = opts.Kloud
	if opts.Kloud == "" {
		opts.Kloud = filepath.Join(tmp, "kloud")
		say("building ./cmd/kloud")
		out, err := exec.CommandContext(ctx, "go", "build", "-o", opts.Kloud, "github.com/kloud-dev/kloud/cmd/kloud").CombinedOutput()
		if err != nil {
			return nil, fmt.Errorf("p2: go build ./cmd/kloud (run from the repository): %w\n%s", err, out)
		}
		rep.Kloud = "./cmd/kloud built from " + gitDescribe(ctx)
	}

	if opts.Raw {
		if err := runRaw(ctx, opts, tmp, &rep.Base, say); err != nil {
			return nil, err
		}
	}

	// The store server.
	if err := os.MkdirAll(filepath.Join(tmp, "store"), 0o700); err != nil {
		return nil, fmt.Errorf("p2: %w", err)
	}
	st, err := startProc("kloud store serve", opts.Kloud, []string{"store", "serve",
		"--data-dir", filepath.Join(tmp, "store"), "--socket", filepath.Join(tmp, "store.sock"), "--log-level", "warn"},
		filepath.Join(tmp, "store.log"))
	if err != nil {
		return nil, fmt.Errorf("p2: %w", err)
	}
	defer st.stop(15 * time.Second)
	mongoURL, err := st.waitLine(ctx, "mongodb://", 2*time.Minute)
	if err != nil {
		return nil, fmt.Errorf("p2: %w", err)
	}
	say("store server pid %d: %s", st.Pid(), mongoURL)

	// The replicas, one at a time: the first creates the store's keys and the secret key the
	// others get a copy of.
	reps := make([]*replica, opts.Replicas)
	defer func() {
		for _, r := range reps {
			if r != nil {
				if r.adm != nil {
					r.adm.Close()
				}
				r.p.stop(15 * time.Second)
			}
		}
	}()
	for i := range reps {
		dir := filepath.Join(tmp, fmt.Sprintf("replica%d", i))
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("p2: %w", err)
		}
		if err := os.WriteFile(filepath.Join(dir, instanceIDFile), []byte("bench-p2-replicas\n"), 0o600); err != nil {
			return nil, fmt.Errorf("p2: %w", err)
		}
		if i > 0 {
			key, err := os.ReadFile(filepath.Join(reps[0].dir, secretKeyFile))
			if err != nil {
				return nil, fmt.Errorf("p2: the first replica's secret key: %w", err)
			}
			if err := os.WriteFile(filepath.Join(dir, secretKeyFile), key, 0o600); err != nil {
				return nil, fmt.Errorf("p2: %w", err)
			}
		}
		r, err := startReplica(ctx, opts, i, dir, mongoURL, tmp)
		if err != nil {
			return nil, err
		}
		reps[i] = r
		if r.adm, r.ac, err = adminConn(ctx, r.url, filepath.Join(dir, adminKeyFile)); err != nil {
			return nil, err
		}
		say("replica %d: kloud serve pid %d on %s", i, r.p.Pid(), r.url)
	}
	rep.Idle = readAll(reps)

	// Kite keys, minted once on the replicas' admin connections (not timed with the
	// registrations); the failover reuses them.
	t0 := time.Now()
	acs := make([]*kite.Conn, len(reps))
	for i, r := range reps {
		acs[i] = r.ac
	}
	var keys, ids []string
	if opts.KiteKeys {
		keys, ids, err = mintKeys(ctx, acs, opts.Kites)
	} else {
		keys, ids, err = mintAgentKeys(ctx, mongoURL, filepath.Join(reps[0].dir, secretKeyFile), reps[0].url, opts.Kites)
	}
	if err != nil {
		return nil, err
	}
	rep.Mint = time.Since(t0)
	say("minted %d kite keys in %s", len(keys), rep.Mint.Round(time.Millisecond))

	// Registrations: kite i to replica i%n (round robin, as a balancer would); should that
	// replica refuse, the next in its order (which alternates so that a dead replica's kites
	// spread over the others).
	n := len(reps)
	kites := make([]*simKite, opts.Kites)
	defer func() {
		sem := make(chan struct{}, 256)
		var wg sync.WaitGroup
		for _, s := range kites {
			if s == nil {
				continue
			}
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				s.close()
			})
		}
		wg.Wait()
	}()
	cpu0 := make([]time.Duration, n)
	for i, r := range reps {
		if cpu0[i], err = measure.ProcCPUTime(r.p.Pid()); err != nil {
			return nil, err
		}
	}
	st0, err := measure.ProcCPUTime(st.Pid())
	if err != nil {
		return nil, err
	}
	gen0 := measure.CPUTime()
	rctx, cancel := context.WithTimeout(ctx, opts.RegisterTimeout)
	defer cancel()
	var kmu sync.Mutex
	reg := fanOut(rctx, opts.Kites, opts.Dialers, func(ctx context.Context, i int) error {
		ctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		k, err := kite.New(kite.Options{Identity: kite.Identity{Name: "sim", ID: ids[i], Username: "sim"}})
		if err != nil {
			return err
		}
		s := &simKite{k: k, id: ids[i], key: keys[i], first: make(chan struct{})}
		s.holder.Store(-1)
		first, alt := i%n, (i/n)%2
		for j := range n {
			// first, then the others alternating direction with i/n.
			r := (first + j) % n
			if alt == 1 && j > 0 {
				r = (first + n - j) % n
			}
			s.urls, s.idx = append(s.urls, reps[r].url), append(s.idx, r)
		}
		kmu.Lock()
		kites[i] = s
		kmu.Unlock()
		s.start(0)
		select {
		case <-s.first:
			return nil
		case <-ctx.Done():
			if err := s.err(); err != nil {
				return fmt.Errorf("not registered: %w", err)
			}
			return fmt.Errorf("not registered: %w", ctx.Err())
		}
	})
	rep.Reg = phase(reg)
	if left := opts.Kites - reg.ok - reg.failed; left > 0 {
		rep.Reg.Failed += left
		if rep.Reg.FirstErr == "" {
			rep.Reg.FirstErr = fmt.Sprintf("%d kites not tried within %s", left, opts.RegisterTimeout)
		}
	}
	rep.GenCPU = measure.CPUTime() - gen0
	rep.RegCPU = make([]time.Duration, n)
	for i, r := range reps {
		c, err := measure.ProcCPUTime(r.p.Pid())
		if err != nil {
			return nil, err
		}
		rep.RegCPU[i] = c - cpu0[i]
	}
	st1, err := measure.ProcCPUTime(st.Pid())
	if err != nil {
		return nil, err
	}
	rep.StoreCPU = st1 - st0
	rep.Loaded = readAll(reps)
	if rep.StoreLoaded, err = measure.ReadProcStatus(st.Pid()); err != nil {
		return nil, err
	}
	rep.Held = held(kites, n)
	say("registered %d kites (%d failed) in %s: %.0f/s; held per replica %v", rep.Reg.OK, rep.Reg.Failed,
		rep.Reg.Wall.Round(time.Millisecond), rep.Reg.PerSecond(), rep.Held)
	if rep.Reg.Failed > 0 {
		say("first registration error: %s", rep.Reg.FirstErr)
	}

	// Queries for kites held by another replica.
	ask := func(holder int) *kite.Conn {
		for j := 1; j < n; j++ {
			if r := reps[(holder+j)%n]; !r.dead {
				return r.ac
			}
		}
		return nil
	}
	vis, err := waitVisible(ctx, kites, ask, func(*simKite) bool { return true })
	rep.Visible = vis
	if err != nil {
		rep.VisibleErr = err.Error()
	}
	say("every kite visible on another replica %s after the registrations ended (%v)", rep.Visible.Round(time.Millisecond), err)
	lat, err := queryElsewhere(ctx, kites, opts.Queries, ask, func(*simKite) bool { return true })
	rep.Query = lat
	if err != nil {
		rep.QueryErr = err.Error()
		say("queries stopped: %s", err)
	}
	say("%d queries asked on another replica: p50 %s p99 %s", rep.Query.N, measure.Ms(rep.Query.P50), measure.Ms(rep.Query.P99))
	rep.After = readAll(reps)
	for i, r := range reps {
		if !r.p.running() {
			return nil, fmt.Errorf("p2: replica %d exited during the run: %w\n%s", i, r.p.exitErr(), readLogTail(r.p.log.Name(), 2000))
		}
	}

	// Failover: SIGKILL replica 0 (by its pid); its kites see their connection drop, their
	// client reconnects, is refused, and goes on to the next replica in its order.
	var moved []*simKite
	for _, s := range kites {
		if s != nil && s.holder.Load() == int32(rep.Killed) {
			moved = append(moved, s)
		}
	}
	rep.KilledKites = len(moved)
	say("SIGKILL replica %d (pid %d), which holds %d kites", rep.Killed, reps[rep.Killed].p.Pid(), len(moved))
	kill := time.Now()
	if err := reps[rep.Killed].p.cmd.Process.Kill(); err != nil {
		return nil, fmt.Errorf("p2: kill replica %d: %w", rep.Killed, err)
	}
	reps[rep.Killed].dead = true
	backAt := func(s *simKite) (time.Duration, bool) {
		at := s.regAt.Load()
		if h := s.holder.Load(); h < 0 || int(h) == rep.Killed || at <= kill.UnixNano() {
			return 0, false
		}
		return time.Duration(at - kill.UnixNano()), true
	}
	deadline := time.Now().Add(opts.FailoverTimeout)
	for {
		back := 0
		for _, s := range moved {
			if _, ok := backAt(s); ok {
				back++
			}
		}
		if back == len(moved) || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	var fo []time.Duration
	for _, s := range moved {
		if d, ok := backAt(s); ok {
			fo = append(fo, d)
		}
	}
	rep.Back = len(fo)
	rep.Failover = measure.Summarize(fo)
	say("%d of %d kites registered again on the other replicas: p50 %s p99 %s max %s", rep.Back, rep.KilledKites,
		measure.Ms(rep.Failover.P50), measure.Ms(rep.Failover.P99), measure.Ms(rep.Failover.Max))

	movedSet := make(map[*simKite]bool, len(moved))
	for _, s := range moved {
		movedSet[s] = true
	}
	vis, err = waitVisible(ctx, kites, ask, func(s *simKite) bool { return movedSet[s] })
	rep.VisibleAfter = vis
	if err != nil {
		rep.VisibleAfterErr = err.Error()
	}
	say("every moved kite visible on the survivor not holding it %s after the failover's wait (%v)", rep.VisibleAfter.Round(time.Millisecond), err)
	lat, err = queryElsewhere(ctx, kites, min(opts.Queries, max(len(moved), 1)), ask, func(s *simKite) bool { return movedSet[s] })
	rep.QueryAfter = lat
	if err != nil {
		rep.QueryAfterErr = err.Error()
		say("queries after the failover stopped: %s", err)
	}
	rep.AfterFail = readAll(reps)
	for i, r := range reps {
		if !r.dead && !r.p.running() {
			return nil, fmt.Errorf("p2: replica %d exited during the run: %w\n%s", i, r.p.exitErr(), readLogTail(r.p.log.Name(), 2000))
		}
	}
	rep.Load[1] = measure.LoadAvg()
	rep.Took = time.Since(rep.Start)
	return rep, nil
}

// startReplica starts `kloud serve --replicas` on a free loopback port (a port taken between
// choosing and binding: it tries again), terraformer pointed at a port nothing listens on (not
// part of P2).
func startReplica(ctx context.Context, opts Options, i int, dir, mongoURL, tmp string) (*replica, error) {
	var lastErr error
	for attempt := range 3 {
		addr, err := freePort()
		if err != nil {
			return nil, err
		}
		tfAddr, err := freePort()
		if err != nil {
			return nil, err
		}
		args := []string{"serve", "--data-dir", dir, "--addr", addr, "--mongo-url", mongoURL,
			"--replicas", "--internal-url", "http://" + addr, "--no-demo", "--no-docker", "--s3", "off",
			"--terraformer-url", "http://" + tfAddr + "/kite"}
		p, err := startProc(fmt.Sprintf("replica %d", i), opts.Kloud, args, filepath.Join(tmp, fmt.Sprintf("replica%d-%d.log", i, attempt)))
		if err != nil {
			return nil, fmt.Errorf("p2: %w", err)
		}
		line, err := p.waitLine(ctx, "kloud ", 2*time.Minute)
		if err != nil {
			p.stop(5 * time.Second)
			lastErr = err
			continue
		}
		_, got, ok := strings.Cut(line, " listening on ")
		if !ok {
			p.stop(5 * time.Second)
			return nil, fmt.Errorf("p2: replica %d printed %q, want \"kloud VERSION listening on ADDR\"", i, line)
		}
		return &replica{p: p, dir: dir, url: "http://" + strings.TrimSpace(got) + "/kite"}, nil
	}
	return nil, fmt.Errorf("p2: replica %d: %w", i, lastErr)
}

// readAll reads every live replica's memory (zero for a dead one).
func readAll(reps []*replica) []measure.ProcStatus {
	out := make([]measure.ProcStatus, len(reps))
	for i, r := range reps {
		if r != nil && !r.dead {
			out[i], _ = measure.ReadProcStatus(r.p.Pid())
		}
	}
	return out
}

// held counts the kites registered with each replica.
func held(kites []*simKite, n int) []int {
	out := make([]int, n)
	for _, s := range kites {
		if s != nil {
			if h := s.holder.Load(); h >= 0 && int(h) < n {
				out[h]++
			}
		}
	}
	return out
}

// waitVisible waits until kontrol.query {query:{id}}, asked on a replica that does not hold it,
// finds each registered kite that want selects: a replica writes its kites' presence records in
// the background, so another replica sees a registration some time after it. It returns how long
// that took from its call (at most visibleTimeout).
func waitVisible(ctx context.Context, kites []*simKite, ask func(holder int) *kite.Conn, want func(*simKite) bool) (time.Duration, error) {
	start := time.Now()
	var pending []*simKite
	for _, s := range kites {
		if s != nil && s.holder.Load() >= 0 && want(s) {
			pending = append(pending, s)
		}
	}
	for len(pending) > 0 {
		var still []*simKite
		for _, s := range pending {
			c := ask(int(s.holder.Load()))
			if c == nil {
				return time.Since(start), errors.New("p2: no other replica to ask")
			}
			var res kontrol.QueryResult
			if err := c.Call(ctx, "kontrol.query", kontrol.QueryParams{Query: kite.Identity{ID: s.id}}, &res); err != nil {
				return time.Since(start), fmt.Errorf("p2: kontrol.query %s: %w", s.id, err)
			}
			if len(res.Kites) != 1 || res.Kites[0].Kite.ID != s.id {
				still = append(still, s)
			}
		}
		pending = still
		if len(pending) == 0 {
			break
		}
		if time.Since(start) > visibleTimeout {
			return time.Since(start), fmt.Errorf("p2: %d kites not visible on another replica after %s", len(pending), visibleTimeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return time.Since(start), nil
}

// visibleTimeout bounds waitVisible.
const visibleTimeout = 2 * time.Minute

// queryElsewhere times q kontrol.query {query:{id}} calls, one after another, for the registered
// kites that want selects, each asked on ask(its holder): a replica that does not hold it. Each
// must return exactly that kite.
func queryElsewhere(ctx context.Context, kites []*simKite, q int, ask func(holder int) *kite.Conn, want func(*simKite) bool) (measure.Latency, error) {
	var live []*simKite
	for _, s := range kites {
		if s != nil && s.holder.Load() >= 0 && want(s) {
			live = append(live, s)
		}
	}
	if len(live) == 0 {
		return measure.Latency{}, errors.New("p2: no registered kite to query for")
	}
	query := func(s *simKite) error {
		c := ask(int(s.holder.Load()))
		if c == nil {
			return errors.New("p2: no other replica to ask")
		}
		var res kontrol.QueryResult
		if err := c.Call(ctx, "kontrol.query", kontrol.QueryParams{Query: kite.Identity{ID: s.id}}, &res); err != nil {
			return fmt.Errorf("p2: kontrol.query %s: %w", s.id, err)
		}
		if len(res.Kites) != 1 || res.Kites[0].Kite.ID != s.id {
			return fmt.Errorf("p2: kontrol.query %s: %d kites: %w", s.id, len(res.Kites), errNotOne)
		}
		return nil
	}
	for i := range min(300, len(live)) { // warm up
		if err := query(live[i]); err != nil {
			return measure.Latency{}, err
		}
	}
	d := make([]time.Duration, 0, q)
	for i := range q {
		t0 := time.Now()
		if err := query(live[i%len(live)]); err != nil {
			return measure.Summarize(d), err
		}
		d = append(d, time.Since(t0))
	}
	return measure.Summarize(d), nil
}

// Pass reports whether issue 2's targets are met across the replicas (registrations/s, query
// p99, every replica's memory) and every killed kite came back.
func (r *ReplicasReport) Pass() bool {
	mem := true
	for i := range r.Loaded {
		mem = mem && r.Loaded[i].VmHWM < TargetRSS && r.After[i].VmRSS < TargetRSS
	}
	return r.Reg.Failed == 0 && r.Reg.PerSecond() >= TargetRegistrationsPerS && r.QueryErr == "" &&
		r.Query.P99 < TargetQueryP99 && mem && r.Back == r.KilledKites && r.QueryAfterErr == "" &&
		r.VisibleErr == "" && r.VisibleAfterErr == ""
}

// Write prints the figures, the baseline and the ratios.
func (r *ReplicasReport) Write(w io.Writer) {
	n := len(r.Loaded)
	fmt.Fprintf(w, "P2 across %d replicas: %d simulated kites (kite.Client, round robin over the replicas), %d dialing at a time\n",
		n, r.Opts.Kites, r.Opts.Dialers)
	fmt.Fprintf(w, "    server: %d × `kloud serve --replicas --internal-url` + `kloud store serve`, %s\n", n, r.Kloud)
	fmt.Fprintf(w, "    %s, %d CPUs, %s; load generator, replicas and store share the machine; load average before %s, after %s\n",
		measure.CPUModel(), runtime.NumCPU(), runtime.Version(), r.Load[0], r.Load[1])
	if raw := r.Base.Raw; raw != nil {
		fmt.Fprintf(w, "raw ws connect + 1 echo        %6d ok %5d failed in %9s = %6.0f conn/s   per conn p50 %s p99 %s\n",
			raw.OK, raw.Failed, raw.Wall.Round(time.Millisecond), raw.PerSecond(), measure.Ms(raw.Lat.P50), measure.Ms(raw.Lat.P99))
	}
	fmt.Fprintf(w, "kite dial+handshake+register   %6d ok %5d failed in %9s = %6.0f reg/s    per kite p50 %s p99 %s\n",
		r.Reg.OK, r.Reg.Failed, r.Reg.Wall.Round(time.Millisecond), r.Reg.PerSecond(), measure.Ms(r.Reg.Lat.P50), measure.Ms(r.Reg.Lat.P99))
	if r.Reg.Failed > 0 {
		fmt.Fprintf(w, "    first error: %s\n", r.Reg.FirstErr)
	}
	if r.Base.Raw != nil {
		fmt.Fprintf(w, "    registrations/s ÷ raw connections/s = %.2f\n", r.Reg.PerSecond()/r.Base.Raw.PerSecond())
	}
	perKite := func(d time.Duration) string { return measure.Us(d / time.Duration(max(r.Reg.OK, 1))) }
	var repCPU time.Duration
	for _, c := range r.RegCPU {
		repCPU += c
	}
	fmt.Fprintf(w, "    CPU per registration: replicas %s, store server %s, load generator %s; held per replica %v\n",
		perKite(repCPU), perKite(r.StoreCPU), perKite(r.GenCPU), r.Held)
	fmt.Fprintf(w, "    minting the keys (%s) took %s, not counted\n",
		map[bool]string{true: "kite keys, kontrol.createKey on the replicas", false: "agent keys, signed with the store's signing key"}[r.Opts.KiteKeys],
		r.Mint.Round(time.Millisecond))
	fmt.Fprintf(w, "presence: every kite found by kontrol.query on a replica that does not hold it %s after the registrations ended\n",
		r.Visible.Round(time.Millisecond))
	if r.VisibleErr != "" {
		fmt.Fprintf(w, "    %s\n", r.VisibleErr)
	}
	fmt.Fprintf(w, "kontrol.query by id, asked on a replica that does not hold the kite: %d calls: p50 %s p90 %s p99 %s max %s\n",
		r.Query.N, measure.Ms(r.Query.P50), measure.Ms(r.Query.P90), measure.Ms(r.Query.P99), measure.Ms(r.Query.Max))
	if r.QueryErr != "" {
		fmt.Fprintf(w, "    stopped early: %s\n", r.QueryErr)
		if r.Opts.KiteKeys {
			fmt.Fprintf(w, "    (kloud mirrors only machine agents' registrations into the store's presence records, which the\n"+
				"    other replicas answer kontrol.query from; with -kite-keys the kites have kontrol.createKey kite keys)\n")
		}
	}
	for i := range r.Loaded {
		fmt.Fprintf(w, "replica %d VmRSS               idle %s; with %d kites %s (VmHWM %s); after the queries %s; after the failover %s\n",
			i, measure.MiB(r.Idle[i].VmRSS), r.Held[i], measure.MiB(r.Loaded[i].VmRSS), measure.MiB(r.Loaded[i].VmHWM),
			measure.MiB(r.After[i].VmRSS), map[bool]string{true: "(killed)", false: measure.MiB(r.AfterFail[i].VmRSS)}[i == r.Killed])
	}
	fmt.Fprintf(w, "store server VmRSS             %s (VmHWM %s) after the registrations\n", measure.MiB(r.StoreLoaded.VmRSS), measure.MiB(r.StoreLoaded.VmHWM))
	fmt.Fprintf(w, "failover: SIGKILL replica %d with %d kites: %d registered again on the others within %s; from the kill: p50 %s p99 %s max %s\n",
		r.Killed, r.KilledKites, r.Back, r.Opts.FailoverTimeout, measure.Ms(r.Failover.P50), measure.Ms(r.Failover.P99), measure.Ms(r.Failover.Max))
	fmt.Fprintf(w, "    every moved kite found on the survivor not holding it %s after they were all back\n", r.VisibleAfter.Round(time.Millisecond))
	if r.VisibleAfterErr != "" {
		fmt.Fprintf(w, "    %s\n", r.VisibleAfterErr)
	}
	fmt.Fprintf(w, "    kontrol.query for the moved kites on the survivor not holding them: %d calls: p50 %s p99 %s\n",
		r.QueryAfter.N, measure.Ms(r.QueryAfter.P50), measure.Ms(r.QueryAfter.P99))
	if r.QueryAfterErr != "" {
		fmt.Fprintf(w, "    stopped early: %s\n", r.QueryAfterErr)
	}
	fmt.Fprintf(w, "P2 replicas %s (%s)\n", map[bool]string{true: "PASS", false: "MISSED a target"}[r.Pass()], r.Took.Round(time.Second))
}

// kontrolIssuer is kloud.Issuer, the iss claim of every key kloud's kontrol mints.
const kontrolIssuer = "kontrol"

// mintAgentKeys mints n machine agent keys (kind agentKey, owner "sim", one made-up machine
// each) with the newest signing key the replicas share in the store, as kloud does when it
// builds a machine, opening the store with the replicas' secret key. Agent kites are what the
// replicas mirror into presence records (what kontrol.query on another replica finds), and
// signing here takes milliseconds where 10,000 kontrol.createKey calls took minutes.
func mintAgentKeys(ctx context.Context, mongoURL, secretKeyPath, kontrolURL string, n int) (keys, ids []string, err error) {
	secret, err := os.ReadFile(secretKeyPath)
	if err != nil {
		return nil, nil, fmt.Errorf("p2: %w", err)
	}
	st, err := store.Open(ctx, store.Options{MongoURL: mongoURL, SecretKey: secret})
	if err != nil {
		return nil, nil, fmt.Errorf("p2: open the store: %w", err)
	}
	defer st.Close(context.WithoutCancel(ctx))
	recs, err := st.Keys().List(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("p2: %w", err)
	}
	var kp *kitekey.KeyPair
	for _, r := range recs { // oldest first: the last one not retired signs
		if r.RetiredAt == nil {
			kp = &kitekey.KeyPair{ID: r.ID, Private: r.Private, Public: r.Public, CreatedAt: r.CreatedAt}
		}
	}
	if kp == nil {
		return nil, nil, errors.New("p2: no signing key in the store")
	}
	sg := &kitekey.Signer{Key: kp, Issuer: kontrolIssuer}
	keys, ids = make([]string, n), make([]string, n)
	for i := range n {
		ids[i] = kitekey.AgentIDPrefix + store.NewID()
		if keys[i], err = sg.AgentKey(kitekey.AgentKeySpec{Owner: "sim", MachineID: fmt.Sprintf("bench-p2-%d", i),
			KiteID: ids[i], KontrolURL: kontrolURL}); err != nil {
			return nil, nil, fmt.Errorf("p2: %w", err)
		}
	}
	return keys, ids, nil
}
