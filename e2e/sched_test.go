package e2e

import (
	"flag"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The package's own scheduler of parallel tests. Go starts a package's parallel tests in no
// particular order once its serial ones are done (all wait on one semaphore of -parallel slots),
// and a browser test held its slot while it waited for the one Chromium (browserMu): in full runs
// the browser tests often started last and ran one after another at the end, with the other slots
// empty and the rest of the suite done (ci35: the last 150 s of e2e, the suite's long pole, ran 1
// to 3 tests). Here:
//
//   - TestMain lifts Go's limit (test.parallel) and keeps its value as this scheduler's number of
//     slots, so every test that calls parallel(t) passes Go's semaphore and waits here instead;
//   - a free slot goes to the waiting test first in the order of expectedSeconds: the browser
//     tests first (their browser runs form a chain, one at a time, so the chain starts early),
//     then the longest tests (a long test started last sets the package's end);
//   - a browser test gives its slot back while it waits for the browser (lockBrowser) and gets
//     one, before any other test, when the browser is free.
//
// Only top-level tests take slots: a parallel subtest runs within its parent's.

// expectedSeconds is a test's wall time in a full run (ci35, the whole suite on 2 cores); a test
// not listed is taken as short. Order matters only roughly: update it when the suite changes much
// (scripts/testtimes.sh prints the figures).
var expectedSeconds = map[string]int{
	"TestReadme": 210, "TestVagrantKloudKilledMidBuild": 160, "TestLocalReapply": 140,
	"TestLocalPorts": 130, "TestVagrantStack": 123, "TestDocsVagrant": 103, "TestLocalStackUpdate": 100,
	"TestDockerKloudKilledMidBuild": 95, "TestDockerStack": 89, "TestKloudKilledMidUpdate": 81,
	"TestDocsDocker": 77, "TestLocalTwoKlouds": 76,
	"TestIdleStop": 76, "TestVagrantReapply": 75, "TestLocalStack": 67, "TestLocalPortsClose": 65,
	"TestTerraformerKilledMidApply": 59, "TestLocalSSH": 55, "TestLocalBuckets": 53,
	"TestDockerReapply": 52, "TestLocalSnapshot": 46, "TestLocalUserScriptFails": 42,
	"TestLocalConstraints": 38, "TestReplicas": 170,
}

// browserTest reports whether test name drives Chromium (it waits for the browser lock): those
// start first.
func browserTest(name string) bool {
	return strings.HasPrefix(name, "TestBrowser") || name == "TestLocalPorts" || name == "TestIdleStop" || name == "TestNetworkCut"
}

// sched is the package's scheduler (set up by TestMain's setupSched).
var sched = &scheduler{slots: 4}

type scheduler struct {
	mu          sync.Mutex
	slots       int // free slots
	browserBusy bool
	waiting     []*waiter
	holding     map[string]bool // top-level tests holding a slot
}

type waiter struct {
	name    string
	rank    int  // higher first
	browser bool // needs the browser too
	ready   chan struct{}
}

// setupSched gives this scheduler Go's -parallel value as its slots and lifts Go's limit. Call it
// in TestMain before m.Run (which then skips its own flag.Parse).
func setupSched() {
	flag.Parse()
	n, err := strconv.Atoi(flag.Lookup("test.parallel").Value.String())
	if err != nil || n < 1 {
		n = 1
	}
	sched.slots = n
	sched.holding = map[string]bool{}
	if err := flag.Set("test.parallel", "10000"); err != nil {
		fmt.Fprintln(os.Stderr, "e2e scheduler:", err)
	}
}

// parallel is t.Parallel() with this package's scheduler: the test continues once it holds a
// slot, which it gives back when it ends.
func parallel(t *testing.T) {
	t.Helper()
	t.Parallel()
	name := t.Name()
	if strings.Contains(name, "/") {
		return
	}
	rank := expectedSeconds[name]
	if browserTest(name) {
		rank += 100000
	}
	t0 := time.Now()
	sched.wait(&waiter{name: name, rank: rank, ready: make(chan struct{})})
	if d := time.Since(t0); d > time.Second {
		t.Logf("e2e scheduler: waited %s for a slot", d.Round(time.Second))
	}
	t.Cleanup(func() { sched.release(name) })
}

// lockBrowser holds the browser (one Chromium at a time) until unlock is called (when the browser
// has exited) or the test ends, whichever comes first: a test's work after its browser run
// (destroying its stacks, stopping its kloud) does not keep the next browser test waiting. While
// it waits, the test's slot goes to another test.
func lockBrowser(t *testing.T) (unlock func()) {
	name := t.Name()
	if i := strings.IndexByte(name, '/'); i >= 0 {
		name = name[:i]
	}
	sched.mu.Lock()
	held := sched.holding[name]
	sched.mu.Unlock()
	if held {
		sched.release(name)
	}
	sched.wait(&waiter{name: name, rank: 1 << 30, browser: true, ready: make(chan struct{})})
	if !held {
		// A test that holds no slot (not parallel) takes none: give back the one wait took.
		sched.release(name)
	}
	var once sync.Once
	unlock = func() {
		once.Do(func() {
			sched.mu.Lock()
			sched.browserBusy = false
			sched.dispatchLocked()
			sched.mu.Unlock()
		})
	}
	t.Cleanup(unlock)
	return unlock
}

// wait queues w and returns when it holds a slot (and the browser, if it asked for it).
func (s *scheduler) wait(w *waiter) {
	s.mu.Lock()
	s.waiting = append(s.waiting, w)
	sort.SliceStable(s.waiting, func(i, j int) bool { return s.waiting[i].rank > s.waiting[j].rank })
	s.dispatchLocked()
	s.mu.Unlock()
	<-w.ready
}

// release gives back name's slot.
func (s *scheduler) release(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.holding[name] {
		return
	}
	delete(s.holding, name)
	s.slots++
	s.dispatchLocked()
}

// dispatchLocked hands free slots to the first waiters that can run: a browser waiter only when
// the browser is free, and then even with every slot taken (one over: it gave its slot up to wait,
// and the browser chain must not wait for a slot).
func (s *scheduler) dispatchLocked() {
	for i := 0; i < len(s.waiting); {
		w := s.waiting[i]
		if w.browser && s.browserBusy || s.slots <= 0 && !(w.browser && s.slots == 0) {
			i++
			continue
		}
		s.waiting = append(s.waiting[:i], s.waiting[i+1:]...)
		s.slots--
		s.holding[w.name] = true
		if w.browser {
			s.browserBusy = true
		}
		close(w.ready)
	}
}
