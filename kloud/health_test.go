package kloud_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/store/storetest"
)

// logBuf keeps kloud's log lines (and passes them to the test's log) so a test can count them.
type logBuf struct {
	mu  sync.Mutex
	buf bytes.Buffer
	t   testing.TB
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.t.Logf("%s", bytes.TrimRight(p, "\n"))
	return l.buf.Write(p)
}

func (l *logBuf) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.buf.String(), s)
}

func readyz(t *testing.T, url string) (int, kloud.Readiness) {
	t.Helper()
	resp, err := http.Get(url + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var r kloud.Readiness
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("/readyz body %q: %v", b, err)
	}
	// camelCase keys on the wire
	if !bytes.Contains(b, []byte(`"notReady"`)) {
		t.Fatalf("/readyz body %s has no notReady", b)
	}
	return resp.StatusCode, r
}

// TestStoreOutage: kloud on an external database that dies answers calls with the
// store-unavailable code (not a hang, not "connection closed"), says so at /readyz naming the
// store, logs the outage once and its end once, and works again when the database is back.
func TestStoreOutage(t *testing.T) {
	t.Parallel()
	db := storetest.NewServer(t)
	lb := &logBuf{t: t}
	e := kloudtest.Start(t, kloudtest.Options{MongoURL: db.URL, Logger: slog.New(slog.NewTextHandler(lb, nil))})
	aliceKey, _, err := e.Server.Kontrol.CreateKey("alice", "")
	if err != nil {
		t.Fatal(err)
	}
	c := api.NewClient(e.DialAuth(kite.Auth{Type: kite.AuthKiteKey, Key: aliceKey}))
	ctx := t.Context()
	if _, err := c.StackList(ctx, api.StackListParams{}); err != nil {
		t.Fatalf("stack.list with the store up: %v", err)
	}
	code, r := readyz(t, e.URL)
	if !r.Checks["store"].Ready || !r.Checks["store"].Required {
		t.Fatalf("/readyz with the store up: %+v", r)
	}
	// No terraformer in this test: kloud is not ready, and says why.
	if code != http.StatusServiceUnavailable || r.Ready || strings.Join(r.NotReady, ",") != "terraformer" {
		t.Fatalf("/readyz without terraformer: %d %+v", code, r)
	}

	db.Stop()
	for i := range 3 {
		start := time.Now()
		_, err := c.StackList(ctx, api.StackListParams{})
		t.Logf("stack.list %d with the store down: %v after %v", i, err, time.Since(start))
		var ke *kite.Error
		if !errors.Is(err, kite.ErrStoreUnavailable) || !errors.As(err, &ke) || ke.Type() != "storeUnavailable" {
			t.Fatalf("stack.list with the store down: %v, want the store-unavailable code %d", err, kite.CodeStoreUnavailable)
		}
	}
	// Kloud's HTTP API too: 503, not a bad gateway.
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.URL+"/api/machines/m1/sessions", nil)
	req.Header.Set("Authorization", "Bearer "+aliceKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "store unavailable") {
		t.Fatalf("GET /api/machines/m1/sessions with the store down: %s %s", resp.Status, body)
	}
	code, r = readyz(t, e.URL)
	if code != http.StatusServiceUnavailable || r.Ready || r.Checks["store"].Ready || r.Checks["store"].Error == "" ||
		len(r.NotReady) != 2 || r.NotReady[0] != "store" {
		t.Fatalf("/readyz with the store down: %d %+v", code, r)
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return lb.count("store unavailable: calls fail") == 1 },
		"no log line for the outage")
	// Several more seconds down: still one line.
	time.Sleep(3 * time.Second)
	if n := lb.count("store unavailable: calls fail"); n != 1 {
		t.Fatalf("%d log lines for one outage, want 1", n)
	}

	db.Start()
	testutil.Eventually(t, 30*time.Second, func() bool {
		_, r := readyz(t, e.URL)
		return r.Checks["store"].Ready
	}, "/readyz: store not ready after it came back")
	testutil.Eventually(t, 10*time.Second, func() bool { return lb.count("store available again") == 1 },
		"no log line for the end of the outage")
	if _, err := c.StackList(ctx, api.StackListParams{}); err != nil {
		t.Fatalf("stack.list with the store back: %v", err)
	}
}

// TestStoreOutageAtHandshake: a connection's handshake checks its key's revocation in the store
// (until the list has been loaded once; then a stale list is used): with the store down that is
// the store-unavailable code too, not an internal error.
func TestStoreOutageAtHandshake(t *testing.T) {
	t.Parallel()
	db := storetest.NewServer(t)
	e := kloudtest.Start(t, kloudtest.Options{MongoURL: db.URL})
	key, _, err := e.Server.Kontrol.CreateKey("bob", "")
	if err != nil {
		t.Fatal(err)
	}
	db.Stop()
	k, err := kite.New(kite.Options{Identity: kite.Identity{Name: "test-client"}, Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	_, err = k.Dial(t.Context(), e.URL+"/kite", kite.Auth{Type: kite.AuthKiteKey, Key: key})
	if !errors.Is(err, kite.ErrStoreUnavailable) {
		t.Fatalf("handshake with the store down: %v, want the store-unavailable code", err)
	}
}

// TestReadyzTerraformer: with a real terraformer kloud is ready (embedded store); while the
// terraformer's supervisor says it is down, /readyz is 503 naming terraformer and the cause.
func TestReadyzTerraformer(t *testing.T) {
	t.Parallel()
	e := kloudtest.Start(t, kloudtest.Options{})
	tc := e.StartTerraformer()
	code, r := readyz(t, e.URL)
	if code != http.StatusOK || !r.Ready || len(r.NotReady) != 0 || !r.Checks["terraformer"].Ready || !r.Checks["store"].Ready {
		t.Fatalf("/readyz with store and terraformer: %d %+v", code, r)
	}
	tc.SetUnavailable(errors.New("exited: signal: killed"))
	code, r = readyz(t, e.URL)
	if code != http.StatusServiceUnavailable || strings.Join(r.NotReady, ",") != "terraformer" ||
		!strings.Contains(r.Checks["terraformer"].Error, "signal: killed") {
		t.Fatalf("/readyz with terraformer down: %d %+v", code, r)
	}
	tc.SetAvailable()
	if code, r = readyz(t, e.URL); code != http.StatusOK || !r.Ready {
		t.Fatalf("/readyz with terraformer back: %d %+v", code, r)
	}
}
