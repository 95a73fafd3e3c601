// Command storegrowth measures whether kloud's store stays fast as it fills (issue 10, item 6):
// the latency of a job update, a machine state transition and stack.apply's own share of store
// work, on the embedded backend (FerretDB v1 on SQLite), with 100, 1,000 and 10,000 finished
// jobs and 1,000 machines (500 stacks of 2) in the store. It prints each figure per size and the
// ratio 10,000 vs 100; the target is flat within 1.2×.
//
//	go run ./bench/storegrowth [-rounds 30] [-sizes 100,1000,10000]
//
// What is timed, per round (medians over the rounds):
//
//   - job update: store.Jobs.Progress on a running job (a conditional update of one job);
//   - machine transition: store.Store.Transition of one machine among the 1,000, Running ↔
//     Stopped (what machine.start/stop and every build step do);
//   - stack.apply's share: the store operations kloud/stacks.go performs for one build of a
//     2-machine stack, in order, with terraform left out (its run is replaced by 20 progress
//     events and 4 log lines, the volume of a small apply): load the stack, take its lease,
//     load its machines, move it to Building with the job id, create and start the job, load
//     the stack and the caller, load the machines, progress, both machines to Building,
//     progress, record terraform's run on the stack, the events, load the machines, progress,
//     both machines to Running, the stack to Initialized, progress 100, finish the job, release
//     the lease. Progress goes through store.ProgressWriter as in kloud (coalesced). It is a
//     replay of stacks.go's store calls, not the method itself: the method needs terraform and
//     agents, whose time would hide the store's.
//   - for comparison, "job update (filter)": the same update with the condition in the filter
//     ({_id, status: running}), which is how every job update was made before: FerretDB scans
//     the whole collection for it.
//
// The finished jobs are realistic documents (50 log lines of 80 bytes each, params, result).
// Every size has its own embedded store (in one temporary directory, removed at the end), all
// open at once; in every round the sizes take turns, so the machine's load hits them alike. It
// exits 1 if a ratio misses the target, 2 on an error.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/kloud-dev/kloud/bench/internal/measure"
	"github.com/kloud-dev/kloud/kloud/store"
)

// Target: the 10,000-job figure within 1.2× of the 100-job one.
const target = 1.2

const (
	stacks      = 500
	perStack    = 2
	logLines    = 50
	tfEvents    = 20
	tfLogLines  = 4
	filterRound = 3 // rounds of the slow comparison row
)

func main() {
	rounds := flag.Int("rounds", 30, "measured rounds per figure and size")
	sizesFlag := flag.String("sizes", "100,1000,10000", "numbers of finished jobs")
	flag.Parse()
	var sizes []int
	for _, f := range strings.Split(*sizesFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 {
			fmt.Fprintln(os.Stderr, "storegrowth: bad -sizes:", *sizesFlag)
			os.Exit(2)
		}
		sizes = append(sizes, n)
	}
	if *rounds >= stacks/2 {
		*rounds = stacks/2 - 1
	}
	load := measure.LoadAvg()
	fmt.Printf("store growth: embedded store, %d machines in %d stacks, %d rounds, GOMAXPROCS %d, load %s\n",
		stacks*perStack, stacks, *rounds, runtime.GOMAXPROCS(0), load)
	// Interrupted, it stops between operations and removes its stores.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dir, err := os.MkdirTemp("", "storegrowth-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "storegrowth:", err)
		os.Exit(2)
	}
	res, err := runAll(ctx, dir, sizes, *rounds)
	os.RemoveAll(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "storegrowth:", err)
		os.Exit(2)
	}
	for _, n := range sizes {
		f := res[n]
		fmt.Printf("%6d finished jobs (seeded in %v): job update %s, machine transition %s, stack.apply share %s (%d job writes), job update (filter) %s\n",
			n, f.seed.Round(time.Millisecond), measure.Ms(f.job), measure.Ms(f.transition), measure.Ms(f.apply), f.applyWrites, measure.Ms(f.jobFilter))
	}
	lo, hi := res[sizes[0]], res[sizes[len(sizes)-1]]
	fmt.Printf("\nratio %d vs %d jobs (target ≤ %.1f):\n", sizes[len(sizes)-1], sizes[0], target)
	missed := false
	for _, r := range []struct {
		name   string
		a, b   time.Duration
		target bool
	}{
		{"job update", lo.job, hi.job, true},
		{"machine transition", lo.transition, hi.transition, true},
		{"stack.apply share", lo.apply, hi.apply, true},
		{"job update (filter), for comparison", lo.jobFilter, hi.jobFilter, false},
	} {
		ratio := float64(r.b) / float64(r.a)
		verdict := ""
		if r.target {
			verdict = "met"
			if ratio > target {
				verdict, missed = "MISSED", true
			}
		}
		fmt.Printf("  %-38s %8s → %8s  %5.2f×  %s\n", r.name, measure.Ms(r.a), measure.Ms(r.b), ratio, verdict)
	}
	if missed {
		os.Exit(1)
	}
}

type figures struct {
	seed                              time.Duration
	job, transition, apply, jobFilter time.Duration
	applyWrites                       int64
}

// bed is one store of the run, seeded with a number of finished jobs.
type bed struct {
	s     *store.Store
	jobID string // the running job updated by "job update"
	f     figures
}

// runAll seeds one store per size, then measures every figure with the sizes taking turns in
// each round, so a change of the machine's load hits them alike.
// The stores live in dir.
func runAll(ctx context.Context, dir string, sizes []int, rounds int) (map[int]figures, error) {
	beds := make([]*bed, len(sizes))
	for i, n := range sizes {
		s, err := store.Open(ctx, store.Options{DataDir: fmt.Sprintf("%s/%d", dir, i), Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			return nil, err
		}
		defer s.Close(context.WithoutCancel(ctx))
		b := &bed{s: s}
		beds[i] = b
		t0 := time.Now()
		if err := seed(ctx, s, n); err != nil {
			return nil, fmt.Errorf("seed: %w", err)
		}
		b.f.seed = time.Since(t0)
		if b.jobID, err = s.Jobs().Create(ctx, store.Job{Kind: "stack.apply", Target: "stack/bench", Owner: "alice"}); err != nil {
			return nil, err
		}
		if _, err := s.Jobs().Start(ctx, b.jobID, "bench"); err != nil {
			return nil, err
		}
	}
	states := [2]string{"Running", "Stopped"}
	for _, fig := range []struct {
		name   string
		rounds int
		out    func(*figures) *time.Duration
		op     func(b *bed, i int) error
	}{
		{"job update", rounds, func(f *figures) *time.Duration { return &f.job }, func(b *bed, i int) error {
			return b.s.Jobs().Progress(ctx, b.jobID, 40+i%30, "Building", "Building stack resources")
		}},
		{"machine transition", rounds, func(f *figures) *time.Duration { return &f.transition }, func(b *bed, i int) error {
			ok, err := b.s.Transition(ctx, store.CollMachines, machineID(stacks/2, 0), []string{states[i%2]}, bson.M{"state": states[(i+1)%2]})
			if err == nil && !ok {
				err = fmt.Errorf("machine not in %s", states[i%2])
			}
			return err
		}},
		{"stack.apply share", rounds, func(f *figures) *time.Duration { return &f.apply }, func(b *bed, i int) error {
			return applyShare(ctx, b.s, stackID(i)) // stacks 0..rounds are NotInitialized: one build each
		}},
		{"job update (filter)", min(rounds, filterRound), func(f *figures) *time.Duration { return &f.jobFilter }, func(b *bed, i int) error {
			res, err := b.s.Collection(store.CollJobs).UpdateOne(ctx, bson.M{"_id": b.jobID, "status": store.JobRunning},
				bson.M{"$set": bson.M{"percent": 40 + i%30, "updatedAt": b.s.Now()}, "$inc": bson.M{"rev": 1}})
			if err == nil && res.MatchedCount != 1 {
				err = fmt.Errorf("matched %d", res.MatchedCount)
			}
			return err
		}},
	} {
		d := make([][]time.Duration, len(beds))
		for i := 0; i <= fig.rounds; i++ { // round 0 warms up
			for k, b := range beds {
				t := time.Now()
				if err := fig.op(b, i); err != nil {
					return nil, fmt.Errorf("%s: %w", fig.name, err)
				}
				if i > 0 {
					d[k] = append(d[k], time.Since(t))
				}
			}
		}
		for k, b := range beds {
			*fig.out(&b.f) = measure.MedianDuration(d[k])
		}
	}
	out := map[int]figures{}
	for k, b := range beds {
		b.f.applyWrites = revs(ctx, b.s) / int64(rounds+1)
		out[sizes[k]] = b.f
	}
	return out, nil
}

// revs sums the rev of the bench's apply jobs: a rough count of job writes.
func revs(ctx context.Context, s *store.Store) int64 {
	js, err := s.Jobs().List(ctx, store.JobFilter{Kind: "stack.apply", Owner: "bench", Limit: 1000})
	if err != nil {
		return 0
	}
	var n int64
	for _, j := range js {
		n += j.Rev
	}
	return n
}

func stackID(i int) string      { return fmt.Sprintf("%024x", 0x5000000+i) }
func machineID(i, k int) string { return fmt.Sprintf("%024x", 0x6000000+i*perStack+k) }

// seed writes the user, the stacks and machines, and n finished jobs.
func seed(ctx context.Context, s *store.Store, n int) error {
	now := s.Now()
	if _, err := s.Collection(store.CollUsers).InsertOne(ctx, bson.M{"_id": "bench", "username": "bench", "createdAt": now}); err != nil {
		return err
	}
	var sts, ms []any
	for i := range stacks {
		var mids []string
		for k := range perStack {
			mids = append(mids, machineID(i, k))
			ms = append(ms, bson.M{"_id": machineID(i, k), "stackId": stackID(i), "label": fmt.Sprintf("m%d", k), "provider": "local",
				"owner": "bench", "team": "bench", "state": "Running", "kiteId": "kloud-agent-" + machineID(i, k),
				"attributes": bson.M{"instance_type": "small", "image": "base"}, "createdAt": now, "updatedAt": now})
		}
		state := "Initialized"
		if i < stacks/2 {
			state = "NotInitialized"
			for k := range perStack {
				ms[len(ms)-perStack+k].(bson.M)["state"] = "NotInitialized"
			}
		}
		sts = append(sts, bson.M{"_id": stackID(i), "title": "bench", "team": "bench", "owner": "bench", "templateId": "t",
			"files": bson.A{bson.M{"name": "main.tf", "content": strings.Repeat("# template\n", 100)}},
			"state": state, "machines": mids, "createdAt": now, "updatedAt": now})
	}
	if _, err := s.Collection(store.CollStacks).InsertMany(ctx, sts); err != nil {
		return err
	}
	if _, err := s.Collection(store.CollMachines).InsertMany(ctx, ms); err != nil {
		return err
	}
	var log []string
	for i := range logLines {
		log = append(log, fmt.Sprintf("local_machine.m%d: Still creating... [%ds elapsed] %s", i%2, i*10, strings.Repeat("·", 30)))
	}
	for done := 0; done < n; {
		batch := make([]any, 0, min(500, n-done))
		for range min(500, n-done) {
			t := now.Add(-time.Duration(n-done) * time.Minute)
			batch = append(batch, store.Job{
				ID: store.NewID(), Kind: "stack.apply", Target: "stack/" + stackID(stacks/2+done%(stacks/2)), Owner: "alice",
				Params: doc(map[string]any{"stackId": stackID(done % stacks), "destroy": false, "lease": "apply-" + store.NewID()}),
				Status: store.JobSucceeded, Percent: 100, Stage: "Running", Message: "Stack building finished",
				Result: doc(map[string]any{"stackId": stackID(done % stacks), "machines": 2}),
				Log:    log, LogSeq: int64(len(log)), Runner: "old", Attempt: 1, Rev: 60,
				CreatedAt: t, UpdatedAt: t.Add(time.Minute), StartedAt: t, FinishedAt: t.Add(time.Minute),
			})
			done++
		}
		if _, err := s.Collection(store.CollJobs).InsertMany(ctx, batch); err != nil {
			return err
		}
	}
	return nil
}

// applyShare replays the store operations of one stack.apply build (kloud/stacks.go:
// stackApply, runStackApply, buildStack), terraform and the agents left out.
func applyShare(ctx context.Context, s *store.Store, sid string) error {
	stacksC, machinesC := s.Collection(store.CollStacks), s.Collection(store.CollMachines)
	loadStack := func() error {
		var st bson.M
		return stacksC.FindOne(ctx, bson.M{"_id": sid}).Decode(&st)
	}
	loadMachines := func() ([]bson.M, error) {
		cur, err := machinesC.Find(ctx, bson.M{"stackId": sid})
		if err != nil {
			return nil, err
		}
		var ms []bson.M
		return ms, cur.All(ctx, &ms)
	}
	check := func(ok bool, err error, what string) error {
		if err == nil && !ok {
			err = fmt.Errorf("%s: not in the expected state", what)
		}
		return err
	}

	// stackApply
	if err := loadStack(); err != nil {
		return err
	}
	owner := "apply-" + store.NewID()
	lease, err := s.AcquireLease(ctx, "stack/"+sid, owner, 5*time.Minute)
	if err != nil {
		return err
	}
	ms, err := loadMachines() // reconcileForApply
	if err != nil {
		return err
	}
	id := store.NewID()
	ok, err := s.Transition(ctx, store.CollStacks, sid, []string{"NotInitialized", "Failed"}, bson.M{"state": "Building", "reason": "", "jobId": id})
	if err := check(ok, err, "stack to Building"); err != nil {
		return err
	}
	js := s.Jobs()
	if _, err := js.Create(ctx, store.Job{ID: id, Kind: "stack.apply", Target: "stack/" + sid, Owner: "bench",
		Params: doc(map[string]any{"stackId": sid, "destroy": false, "lease": owner})}); err != nil {
		return err
	}
	if _, err := js.Start(ctx, id, s.InstanceID()); err != nil {
		return err
	}

	// runStackApply and buildStack
	pw := store.NewProgressWriter(0, func(ctx context.Context, p store.Progress) error {
		return js.Progress(ctx, id, p.Percent, p.Stage, p.Message)
	})
	defer pw.Stop()
	progress := func(pct int, stage, msg string) error {
		return pw.Set(ctx, store.Progress{Percent: pct, Stage: stage, Message: msg})
	}
	if err := loadStack(); err != nil {
		return err
	}
	if err := s.Collection(store.CollUsers).FindOne(ctx, bson.M{"_id": "bench"}).Err(); err != nil { // callerByName
		return err
	}
	cur, err := s.Collection(store.CollTeams).Find(ctx, bson.M{"members.username": "bench"})
	if err != nil {
		return err
	}
	if err := cur.All(ctx, &[]bson.M{}); err != nil {
		return err
	}
	if ms, err = loadMachines(); err != nil {
		return err
	}
	if err := progress(10, "Building", "Checking machines"); err != nil {
		return err
	}
	for _, m := range ms {
		ok, err := s.Transition(ctx, store.CollMachines, m["_id"], []string{"NotInitialized", "Running", "Stopped", "Unknown", "Failed"},
			bson.M{"state": "Building", "reason": "", "updatedAt": s.Now()})
		if err := check(ok, err, "machine to Building"); err != nil {
			return err
		}
	}
	for _, p := range []struct {
		pct int
		msg string
	}{{20, "Fetching and validating credentials"}, {30, "Preparing the agents' user data"}, {40, "Building stack resources"}} {
		if err := progress(p.pct, "Building", p.msg); err != nil {
			return err
		}
	}
	if _, err := stacksC.UpdateOne(ctx, bson.M{"_id": sid}, bson.M{"$set": bson.M{"tfJobId": store.NewID(), "updatedAt": s.Now()}}); err != nil {
		return err
	}
	for e := range tfEvents { // terraform's events: progress (coalesced) and a few log lines
		if err := progress(40+e*30/tfEvents, "Building", "Building stack resources"); err != nil {
			return err
		}
		if e%(tfEvents/tfLogLines) == 0 {
			if err := js.Log(ctx, id, fmt.Sprintf("local_machine.m%d: Creation complete after %ds", e%2, e)); err != nil {
				return err
			}
		}
	}
	if ms, err = loadMachines(); err != nil {
		return err
	}
	if err := progress(70, "Building", "Checking machines' agents"); err != nil {
		return err
	}
	if err := progress(90, "Building", "Updating machine settings"); err != nil {
		return err
	}
	for _, m := range ms {
		ok, err := s.Transition(ctx, store.CollMachines, m["_id"], []string{"Building"}, bson.M{"state": "Running", "reason": "",
			"attributes": bson.M{"instance_type": "small", "image": "base"}, "ipAddress": "10.200.0.2",
			"agent.status": "connected", "agent.lastSeen": s.Now(), "updatedAt": s.Now()})
		if err := check(ok, err, "machine to Running"); err != nil {
			return err
		}
	}
	if _, err := stacksC.UpdateOne(ctx, bson.M{"_id": sid}, bson.M{"$set": bson.M{"state": "Initialized", "reason": "", "updatedAt": s.Now()}}); err != nil {
		return err
	}
	if err := progress(100, "Running", "Stack building finished"); err != nil {
		return err
	}
	pw.Stop()
	if err := pw.Flush(ctx); err != nil {
		return err
	}
	if err := js.Finish(ctx, id, nil, doc(map[string]any{"stackId": sid, "machines": len(ms)})); err != nil {
		return err
	}
	return lease.Release(ctx)
}

// doc is m as a job's params or result (the keys a stack.apply job has).
func doc(m map[string]any) store.Doc {
	d, err := store.EncodeDoc(m)
	if err != nil {
		panic(err) // a map of strings, bools and ints always encodes
	}
	return d
}
