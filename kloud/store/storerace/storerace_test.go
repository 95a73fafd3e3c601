package storerace_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/kloud-dev/kloud/kloud/store/storerace"
	"github.com/kloud-dev/kloud/kloud/store/storetest"
)

// workerEnv, when set in the environment, makes this test binary a race worker (TestMain):
// {url, db, rounds, workers, name} as JSON; it waits for its stdin to close, runs storerace.Run
// and prints its Tally as JSON.
const workerEnv = "KLOUD_STORERACE_WORKER"

type workerSpec struct {
	URL     string `json:"url"`
	DB      string `json:"db"`
	Rounds  int    `json:"rounds"`
	Workers int    `json:"workers"`
	Name    string `json:"name"`
}

func TestMain(m *testing.M) {
	if spec := os.Getenv(workerEnv); spec != "" {
		os.Exit(worker(spec))
	}
	os.Exit(m.Run())
}

func worker(spec string) int {
	var w workerSpec
	if err := json.Unmarshal([]byte(spec), &w); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	c, err := mongo.Connect(options.Client().ApplyURI(w.URL))
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	defer c.Disconnect(context.Background())
	if err := c.Ping(ctx, nil); err != nil { // connected before the start
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin) // the start: the test closes our stdin
	t := storerace.Run(ctx, c.Database(w.DB), storerace.Options{Rounds: w.Rounds, Workers: w.Workers, Name: w.Name})
	if err := json.NewEncoder(os.Stdout).Encode(t); err != nil {
		return 1
	}
	return 0
}

// raceRounds is the rounds of the race test: 400, or KLOUD_STORERACE_ROUNDS (the issue's
// figure is KLOUD_STORERACE_ROUNDS=2000: ~9 min for the served half on a loaded 2-CPU host, as
// every command waits its turn; docs/deployment.md has the counts).
func raceRounds(t *testing.T) int {
	if v := os.Getenv("KLOUD_STORERACE_ROUNDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("KLOUD_STORERACE_ROUNDS=%q", v)
		}
		return n
	}
	return 400
}

// race runs the race from two processes of this test binary × 4 goroutines against mongoURL
// (each process with a pool of 4 connections) and checks it.
func race(t *testing.T, mongoURL, db string, rounds int) storerace.Result {
	t.Helper()
	ctx := context.Background()
	c, err := mongo.Connect(options.Client().ApplyURI(mongoURL))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Disconnect(ctx)
	if err := storerace.Prepare(ctx, c.Database(db), rounds); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	type proc struct {
		cmd   *exec.Cmd
		stdin io.WriteCloser
		out   *bufio.Reader
	}
	var procs []proc
	for i := range 2 {
		spec, _ := json.Marshal(workerSpec{URL: mongoURL, DB: db, Rounds: rounds, Workers: 4, Name: fmt.Sprintf("p%d", i)})
		cmd := exec.Command(self, "-test.run=^$")
		cmd.Env = append(os.Environ(), workerEnv+"="+string(spec))
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		procs = append(procs, proc{cmd, stdin, bufio.NewReader(stdout)})
	}
	for _, p := range procs { // both connected: start them at once
		if l, err := p.out.ReadString('\n'); err != nil || strings.TrimSpace(l) != "ready" {
			t.Fatalf("worker not ready: %q %v", l, err)
		}
	}
	for _, p := range procs {
		_ = p.stdin.Close()
	}
	tallies := make([]storerace.Tally, len(procs))
	var wg sync.WaitGroup
	for i, p := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := json.NewDecoder(p.out).Decode(&tallies[i]); err != nil {
				t.Errorf("worker %d: %v", i, err)
			}
			if tallies[i].FirstError != "" {
				t.Logf("worker %d: %d errors, the first: %s", i, tallies[i].Errors, tallies[i].FirstError)
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	res, err := storerace.Check(ctx, c.Database(db), rounds, tallies...)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// withPool replaces the options of a mongodb:// URL with a pool of n connections (the host
// of a unix socket URL is escaped: net/url does not parse it).
func withPool(mongoURL string, n int) string {
	base, _, _ := strings.Cut(mongoURL, "?")
	return fmt.Sprintf("%s?maxPoolSize=%d&serverSelectionTimeoutMS=60000", base, n)
}

// The race (2 processes × 4 goroutines × rounds (raceRounds) of claim, compare-and-swap and
// $inc) against `kloud store serve`: no violation. The same race against a plain FerretDB
// (the same SQLite backend, several connections) is the control: it shows why the server
// exists; its counts are logged, and at least one violation is expected of it (FerretDB v1
// runs updates as read, modify, write back), but how many depends on the host's scheduling.
func TestRaceStoreServeVersusPlainFerretDB(t *testing.T) {
	rounds := raceRounds(t)

	start := time.Now()
	served := race(t, withPool(storetest.Serve(t), 4), "race", rounds)
	t.Logf("kloud store serve: %s (%s)", served, time.Since(start).Round(time.Second))
	if !served.OK() {
		t.Errorf("kloud store serve: %s; want no violation and no error", served)
	}
	if served.Increments != 2*4*rounds {
		t.Errorf("kloud store serve: %d increments acknowledged, want %d", served.Increments, 2*4*rounds)
	}

	start = time.Now()
	plain := race(t, withPool(storetest.NewServer(t).URL, 4), "race", rounds)
	t.Logf("plain FerretDB v1, several connections (control): %s (%s)", plain, time.Since(start).Round(time.Second))
	if plain.DoubleClaims+plain.DoubleCAS+plain.LostIncrements == 0 {
		t.Errorf("plain FerretDB: no violation in %d rounds; the control should show FerretDB v1's lost updates (has FerretDB changed? then revisit kloud store serve)", rounds)
	}
}
