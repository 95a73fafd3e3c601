package load

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kontrol/kontrolapi"
	"github.com/kloud-dev/kloud/providers/dummy"
)

// full reports whether the suite runs its full sizes (make load: LOAD=full).
func full() bool { return os.Getenv("LOAD") == "full" }

// size is the env variable name's integer value, else full's or tiny's (the version make test
// runs, seconds in all).
func size(t testing.TB, name string, fullN, tinyN int) int {
	t.Helper()
	if v := os.Getenv(name); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("%s=%q: want a positive integer", name, v)
		}
		return n
	}
	if full() {
		return fullN
	}
	return tinyN
}

// duration is like size for a duration (LOAD_DURATION=60s).
func duration(t testing.TB, name string, fullD, tinyD time.Duration) time.Duration {
	t.Helper()
	if v := os.Getenv(name); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("%s=%q: want a positive duration (60s)", name, v)
		}
		return d
	}
	if full() {
		return fullD
	}
	return tinyD
}

// kloudProc is one `kloud serve` process on a data dir of the test, restartable on the same
// data and port: the real binary, with its real store and terraformer, dummy machines (klient
// processes of this host) in dir/machines, nothing of the host's (no local machines, no docker,
// no S3 server).
type kloudProc struct {
	t     *testing.T
	dir   string
	addr  string
	tf    string // the terraformer's address, kept across restarts
	extra []string
	cmd   *exec.Cmd
	out   *testutil.SyncBuffer
	done  chan struct{}
}

// startKloud starts kloud with extra flags of kloud serve and waits until it serves and its
// terraformer answers. Cleanup stops it and the dummy machines.
func startKloud(t *testing.T, extra ...string) *kloudProc {
	t.Helper()
	testutil.RequireBinary(t, "terraform")
	testutil.RequireBinary(t, "curl")
	k := &kloudProc{t: t, dir: t.TempDir(), addr: testutil.FreeLoopback(t), tf: testutil.FreeLoopback(t), extra: extra}
	t.Cleanup(k.cleanup)
	k.start()
	return k
}

func (k *kloudProc) url() string { return "http://" + k.addr }

func (k *kloudProc) start() {
	t := k.t
	t.Helper()
	args := []string{"serve", "--data-dir", k.dir, "--addr", k.addr,
		"--klient-bin", testutil.BuildBinary(t, "./cmd/klient"), "--terraformer-bin", testutil.BuildBinary(t, "./cmd/terraformer"),
		"--terraformer-addr", k.tf, "--dummy-dir", filepath.Join(k.dir, "machines"),
		"--no-local", "--no-docker", "--s3", "off"}
	cmd := exec.Command(testutil.BuildBinary(t, "./cmd/kloud"), append(args, k.extra...)...)
	k.out = &testutil.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = k.out, k.out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // dies with the test process
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	k.cmd, k.done = cmd, make(chan struct{})
	go func() { cmd.Wait(); close(k.done) }()
	k.waitUp(90 * time.Second)
}

// waitUp waits until kloud answers /healthz and has printed its terraformer's URL.
func (k *kloudProc) waitUp(timeout time.Duration) {
	k.t.Helper()
	testutil.Eventually(k.t, timeout, func() bool {
		select {
		case <-k.done:
			k.t.Fatalf("kloud exited:\n%s", k.out)
		default:
		}
		code, _ := httpStatus(k.url() + "/healthz")
		return code == 200 && strings.Contains(k.out.String(), "terraformer: http")
	}, "kloud did not come up:\n%s", k.out)
}

// kill SIGKILLs kloud (by its pid) and waits for it.
func (k *kloudProc) kill() {
	k.cmd.Process.Signal(syscall.SIGKILL)
	<-k.done
}

func (k *kloudProc) cleanup() {
	select {
	case <-k.done:
	default:
		k.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-k.done:
		case <-time.After(30 * time.Second):
			k.cmd.Process.Kill()
			<-k.done
		}
	}
	if k.t.Failed() {
		k.t.Logf("kloud output (tail):\n%s", tail(k.out.String(), 8000))
	}
	if err := dummy.KillAll(context.Background(), filepath.Join(k.dir, "machines")); err != nil {
		k.t.Error(err)
	}
}

// pid is kloud's process id.
func (k *kloudProc) pid() int { return k.cmd.Process.Pid }

// dial connects a kite authenticated with key to kloud. opts may set RateLimitedRetry.
func (k *kloudProc) dial(ctx context.Context, key string, retry time.Duration) (*kite.Conn, error) {
	kt, err := kite.New(kite.Options{Identity: kite.Identity{Name: "load"}, RateLimitedRetry: retry})
	if err != nil {
		return nil, err
	}
	k.t.Cleanup(func() { kt.Close() })
	return kt.Dial(ctx, k.url()+"/kite", kite.Auth{Type: kite.AuthKiteKey, Key: key})
}

// adminKey is the admin kite key of kloud's data dir.
func (k *kloudProc) adminKey() string {
	k.t.Helper()
	key, err := kitekey.ReadFile(filepath.Join(k.dir, "admin.key"))
	if err != nil {
		k.t.Fatal(err)
	}
	return key
}

// admin is a connection with the admin key of kloud's data dir. Its calls wait out the admin's
// rate limit (setup, not measured).
func (k *kloudProc) admin(ctx context.Context) *kite.Conn {
	k.t.Helper()
	c, err := k.dial(ctx, k.adminKey(), 5*time.Minute)
	if err != nil {
		k.t.Fatalf("admin dial: %v", err)
	}
	return c
}

// addUsers adds n members named prefix0..prefixN-1, member i of team team(i) (nil: all of
// team default, which must exist), and returns a kite key of each (kontrol.createKey), a few
// at a time.
func (k *kloudProc) addUsers(ctx context.Context, admin *kite.Conn, prefix string, n int, team func(i int) string) []string {
	k.t.Helper()
	keys := make([]string, n)
	ac := api.NewClient(admin)
	if team == nil {
		team = func(int) string { return "default" }
	}
	err := fanOut(ctx, n, 8, func(ctx context.Context, i int) error {
		u := fmt.Sprintf("%s%d", prefix, i)
		if _, err := ac.UserAdd(ctx, api.UserAddParams{Username: u, Team: team(i)}); err != nil {
			return fmt.Errorf("user.add %s: %w", u, err)
		}
		var r kontrolapi.CreateKeyResult
		if err := admin.Call(ctx, kontrolapi.MethodCreateKey, kontrolapi.CreateKeyParams{Username: u}, &r); err != nil {
			return fmt.Errorf("kontrol.createKey %s: %w", u, err)
		}
		keys[i] = r.Key
		return nil
	})
	if err != nil {
		k.t.Fatal(err)
	}
	return keys
}

// rss is the resident memory of pid (VmRSS of /proc/pid/status), in bytes.
func rss(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			f := strings.Fields(v)
			n, _ := strconv.ParseInt(f[0], 10, 64)
			return n << 10
		}
	}
	return 0
}

// peak samples f (a memory figure) now and every 250 ms until the returned function is called,
// which returns the largest value seen.
func peak(f func() int64) (stop func() int64) {
	var hi int64
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			hi = max(hi, f())
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	return func() int64 {
		close(done)
		<-stopped
		return max(hi, f())
	}
}

func mib(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }

// fanOut runs f(i) for i in [0,n), at most par at once, and returns the first error.
func fanOut(ctx context.Context, n, par int, f func(ctx context.Context, i int) error) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	sem := make(chan struct{}, par)
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := f(ctx, i); err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return first
}

// pct is the p-th percentile (0..100) of d, sorted in place.
func pct(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	i := int(float64(len(d)-1) * p / 100)
	return d[i]
}

// planCall is the context of a call that plans (stack.create): 10 minutes, as the CLI gives
// such calls (kloud/cli planCallTimeout) rather than the kite's default 30s, which a loaded
// host's terraform plan took longer than (CI).
func planCall(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, 10*time.Minute)
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }

// commit names the tree the suite ran on, for the figures' rows.
func commit() string {
	out, err := exec.Command("git", "describe", "--always", "--dirty=+dirty", "--abbrev=10").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}

// report prints Markdown lines (the figures of docs/RELIABILITY.md) to stdout, which go test -v
// shows as they come, and to the test's log.
func report(lines ...string) {
	for _, l := range lines {
		fmt.Println(l)
	}
}

// httpStatus is the status code of a GET of url (0 when it fails).
func httpStatus(url string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
