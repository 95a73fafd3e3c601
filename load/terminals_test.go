package load

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/kloud-dev/kloud/klient/klientapi"
	"github.com/kloud-dev/kloud/kloud/api"
)

// sessionsPerMachine is klient's cap of sessions of one user (webterm.DefaultMaxSessionsPerUser).
const sessionsPerMachine = 20

// TestLoadTerminals: LOAD_TERMINALS terminals (full 200, tiny 5), each its own shell session
// on one of a stack's dummy machines (real klient processes; at most 20 sessions of a member
// on one machine, klient's cap, so 200 take 10 machines), opened through kloud's terminal
// endpoint as the browser opens it (a WebSocket, kloud relaying to klient's attachment). All
// stream LOAD_TERMINAL_MB MiB (full 2, tiny 0.25) of output at once. Targets: every terminal
// gets all its output (none starves: min/median/max throughput per terminal printed), and
// kloud's and the klients' memory bounded (RSS before, during, after, printed).
func TestLoadTerminals(t *testing.T) {
	t.Parallel()
	n := size(t, "LOAD_TERMINALS", 200, 5)
	kib := size(t, "LOAD_TERMINAL_KIB", 2048, 256)
	machines := (n + sessionsPerMachine - 1) / sessionsPerMachine
	k := startKloud(t)
	ctx := context.Background()
	key := k.addUsers(ctx, k.admin(ctx), "viewer", 1, nil)[0]
	c, err := k.dial(ctx, key, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	a := api.NewClient(c)
	cr, err := a.CredentialAdd(ctx, api.CredentialAddParams{Provider: "dummy", Title: "mine", Data: json.RawMessage(`{"token":"abc123"}`)})
	if err != nil {
		t.Fatal(err)
	}
	tp, err := a.TemplateCreate(ctx, api.TemplateParams{Title: "terminals", Files: machineTemplate(machines, "load")})
	if err != nil {
		t.Fatal(err)
	}
	pctx, cancel := planCall(ctx)
	st, err := a.StackCreate(pctx, api.StackPlanParams{TemplateID: tp.ID, Credentials: map[string]string{"dummy": cr.ID}})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	ref, err := a.StackApply(ctx, api.StackApplyParams{StackID: st.Stack.ID})
	if err != nil {
		t.Fatal(err)
	}
	bctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	if j := waitJob(bctx, a, ref.JobID); j.Status != api.JobSucceeded {
		t.Fatalf("build: %s %s %s", j.Status, j.Message, j.Error)
	}
	v, err := a.StackDescribe(ctx, api.StackRef{StackID: st.Stack.ID})
	if err != nil {
		t.Fatal(err)
	}
	if len(v.MachineDocs) != machines {
		t.Fatalf("%d machines, want %d", len(v.MachineDocs), machines)
	}
	machinesDir := filepath.Join(k.dir, "machines")
	// A dummy machine's root is a directory of this host (machines/<stack>/<label>) and klient
	// starts a member's shells as their account in its etc/passwd, which the member's cloud-init
	// would have made: here, as the test's own uid, with the machine's root as home.
	for _, m := range v.MachineDocs {
		root := filepath.Join(machinesDir, st.Stack.ID, m.Label)
		if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
			t.Fatal(err)
		}
		line := fmt.Sprintf("viewer0:x:%d:%d:viewer0:%s:/bin/bash\n", os.Getuid(), os.Getgid(), root)
		if err := os.WriteFile(filepath.Join(root, "etc", "passwd"), []byte(line), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	klientRSS := func() int64 {
		var sum int64
		for _, pid := range procsUnder(machinesDir, "klient") {
			sum += rss(pid)
		}
		return sum
	}

	// Open every terminal and wait for its shell.
	terms := make([]*loadTerm, n)
	t.Cleanup(func() {
		for _, tm := range terms {
			if tm != nil {
				tm.ws.CloseNow()
			}
		}
	})
	if err := fanOut(ctx, n, 20, func(ctx context.Context, i int) error {
		m := v.MachineDocs[i%machines]
		tm, err := openTerm(ctx, k.url(), key, m.ID, fmt.Sprintf("load%d", i))
		if err != nil {
			return fmt.Errorf("terminal %d: %w", i, err)
		}
		terms[i] = tm
		rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		if err := tm.send(rctx, "stty -echo; PS1=''; echo READY-$((1+1))\r"); err != nil {
			return fmt.Errorf("terminal %d: %w", i, err)
		}
		if _, err := tm.until(rctx, "READY-2"); err != nil {
			return fmt.Errorf("terminal %d: shell not ready: %w", i, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	kloud0, klient0 := rss(k.pid()), klientRSS()

	// All stream at once.
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		rates  []float64 // MB/s per terminal
		took   []time.Duration
		failed []string
	)
	kloudPeak, klientPeak := peak(func() int64 { return rss(k.pid()) }), peak(klientRSS)
	want := int64(kib) << 10
	cmd := fmt.Sprintf("yes 0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopq | head -c %d; echo; echo DONE-$((40+2))\r", want)
	start := time.Now()
	sctx, scancel := context.WithTimeout(ctx, 10*time.Minute)
	defer scancel()
	for i, tm := range terms {
		wg.Go(func() {
			t0 := time.Now()
			err := tm.send(sctx, cmd)
			var got int64
			if err == nil {
				got, err = tm.until(sctx, "DONE-42")
			}
			d := time.Since(t0)
			mu.Lock()
			defer mu.Unlock()
			if err != nil || got < want {
				failed = append(failed, fmt.Sprintf("terminal %d: %d of %d bytes in %s: %v", i, got, want, d, err))
				return
			}
			rates = append(rates, float64(got)/1e6/d.Seconds())
			took = append(took, d)
		})
	}
	wg.Wait()
	wall := time.Since(start)
	kloudHi, klntHi := kloudPeak(), klientPeak()

	// Close the terminals and end their sessions; memory after.
	for i, tm := range terms {
		tm.ws.Close(websocket.StatusNormalClosure, "")
		m := v.MachineDocs[i%machines]
		req, _ := http.NewRequestWithContext(ctx, http.MethodDelete, k.url()+"/api/machines/"+m.ID+"/sessions/"+fmt.Sprintf("load%d", i), nil)
		req.Header.Set("Authorization", "Bearer "+key)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}
	terms = nil
	var kloud1, klient1 int64
	// Let the relays and PTYs wind down before reading memory after (bounded: 5 s).
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		kloud1, klient1 = rss(k.pid()), klientRSS()
	}

	for _, f := range failed {
		t.Error(f)
	}
	slices.Sort(rates)
	lo, med, hi := 0.0, 0.0, 0.0
	if len(rates) > 0 {
		lo, med, hi = rates[0], rates[len(rates)/2], rates[len(rates)-1]
	}
	report(fmt.Sprintf("| %d terminals through kloud's relay (%d klient processes, %d sessions each), each streaming %d KiB at once | %d of %d got all their output; all done in %s (slowest %s) | per terminal MB/s min %.2f, median %.2f, max %.2f (%.1f MB/s in all) | kloud RSS %s before, max %s during, %s after; klients (sum) %s, %s, %s | %s |",
		n, machines, min(n, sessionsPerMachine), kib, len(rates), n, wall.Round(time.Millisecond), pct(took, 100).Round(time.Millisecond),
		lo, med, hi, float64(want)*float64(len(rates))/1e6/wall.Seconds(),
		mib(kloud0), mib(kloudHi), mib(kloud1), mib(klient0), mib(klntHi), mib(klient1), commit()))
	if full() && med > 0 && lo < med/10 {
		t.Errorf("a terminal starved: min %.2f MB/s, under a tenth of the median %.2f MB/s", lo, med)
	}
}

// loadTerm is a terminal as the browser opens it: kloud's terminal WebSocket of a session.
type loadTerm struct {
	ws   *websocket.Conn
	tail []byte
}

func openTerm(ctx context.Context, base, key, machineID, session string) (*loadTerm, error) {
	dctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	h := http.Header{"Authorization": {"Bearer " + key}}
	ws, _, err := websocket.Dial(dctx, base+"/api/machines/"+machineID+"/terminal?session="+session+"&cols=120&rows=40", &websocket.DialOptions{HTTPHeader: h})
	if err != nil {
		return nil, err
	}
	ws.SetReadLimit(klientapi.MaxFrame)
	return &loadTerm{ws: ws}, nil
}

func (tm *loadTerm) send(ctx context.Context, s string) error {
	return tm.ws.Write(ctx, websocket.MessageBinary, append([]byte{klientapi.OpInput}, s...))
}

// until reads output (binary frames; text frames are the relay's notices) until marker and
// returns how many bytes it read.
func (tm *loadTerm) until(ctx context.Context, marker string) (int64, error) {
	var n int64
	for {
		typ, b, err := tm.ws.Read(ctx)
		if err != nil {
			return n, err
		}
		if typ != websocket.MessageBinary {
			continue
		}
		n += int64(len(b))
		tm.tail = append(tm.tail, b...)
		if i := bytes.Index(tm.tail, []byte(marker)); i >= 0 {
			tm.tail = append(tm.tail[:0], tm.tail[i+len(marker):]...)
			return n, nil
		}
		if len(tm.tail) > len(marker) {
			tm.tail = append(tm.tail[:0], tm.tail[len(tm.tail)-len(marker):]...)
		}
	}
}

// procsUnder returns the processes named name whose executable lies under dir (the dummy
// machines' klients, which provision.sh downloaded into each machine's root).
func procsUnder(dir, name string) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range entries {
		exe, err := os.Readlink("/proc/" + e.Name() + "/exe")
		if err != nil || !strings.HasPrefix(exe, dir+"/") || filepath.Base(exe) != name {
			continue
		}
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}
