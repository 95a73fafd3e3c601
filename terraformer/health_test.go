package terraformer_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/terraformer"
	"github.com/kloud-dev/kloud/terraformer/terraformertest"
)

func getReadyz(t *testing.T, url string) (int, terraformer.Readiness, string) {
	t.Helper()
	resp, err := http.Get(url + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var rd terraformer.Readiness
	if err := json.Unmarshal(b, &rd); err != nil {
		t.Fatalf("/readyz body %q: %v", b, err)
	}
	return resp.StatusCode, rd, string(b)
}

// TestHealthAndReadiness runs the real terraformer binary: /healthz answers while it serves;
// /readyz is ready while kloud's keys answer, and 503 naming kloudKeys when they do not.
func TestHealthAndReadiness(t *testing.T) {
	keys := terraformertest.StartKeys(t)
	// kloud's keys behind a server this test can take away.
	kloudSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		resp, err := http.Get(keys.URL + r.URL.Path)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		w.WriteHeader(resp.StatusCode)
		io.Copy(w, resp.Body)
	}))
	t.Cleanup(kloudSrv.Close)
	p := startProc(t, &terraformertest.Keys{URL: kloudSrv.URL}, 30*time.Second)

	resp, err := http.Get(p.url() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/healthz: %s", resp.Status)
	}
	code, rd, body := getReadyz(t, p.url())
	t.Logf("/readyz: %d %s", code, body)
	if code != http.StatusOK || !rd.Ready || len(rd.NotReady) != 0 ||
		!rd.Checks["terraform"].Ready || !rd.Checks["dataDir"].Ready || !rd.Checks["kloudKeys"].Ready {
		t.Fatalf("/readyz with kloud up: %d %s", code, body)
	}
	if !strings.Contains(body, `"notReady":[]`) {
		t.Fatalf("/readyz body %s: want camelCase notReady", body)
	}

	kloudSrv.Close()
	code, rd, body = getReadyz(t, p.url())
	t.Logf("/readyz with kloud's keys gone: %d %s", code, body)
	if code != http.StatusServiceUnavailable || rd.Ready || strings.Join(rd.NotReady, ",") != "kloudKeys" ||
		rd.Checks["kloudKeys"].Error == "" || !rd.Checks["terraform"].Ready {
		t.Fatalf("/readyz with kloud's keys gone: %d %s", code, body)
	}
}
