package e2e

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
)

// TestDoctor: kloud doctor on a healthy kloud (with the terraformer it starts) passes every
// required check, twice, also as --json; with a terraformer of its own that is then stopped, it
// names the terraformer, says what to do and exits 1; a member may not run it.
func TestDoctor(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	for range 2 {
		out := e.run("doctor")
		for _, c := range []string{"kloud", "versions", "clock", "store", "store.atomic", "clock.store", "terraformer", "provider.dummy", "mirror"} {
			if !strings.Contains(out, "\n"+c+" ") {
				t.Errorf("doctor does not list %s:\n%s", c, out)
			}
		}
		if strings.Contains(out, "FAILED") {
			t.Errorf("doctor on a healthy kloud:\n%s", out)
		}
	}
	var res struct {
		OK     bool
		Checks []struct {
			Name, Detail, Error string
			OK, Required        bool
		}
	}
	e.runJSON(&res, "doctor")
	byName := map[string]bool{}
	for _, c := range res.Checks {
		byName[c.Name] = c.OK
		if c.Name == "terraformer" && !strings.Contains(c.Detail, "terraform ") {
			t.Errorf("terraformer check without versions: %+v", c)
		}
	}
	if !res.OK || !byName["store.atomic"] || !byName["terraformer"] || !byName["clock"] || !byName["clock.store"] {
		t.Errorf("doctor --json: %+v", res)
	}

	// A terraformer of its own, stopped.
	tfAddr := testutil.FreeLoopback(t)
	tf := testutil.StartProcess(t, filepath.Join(bin, "terraformer"), "--addr", tfAddr, "--data-dir", filepath.Join(t.TempDir(), "tf"),
		"--kloud-url", "http://"+e.addr, "--terraform", testutil.RequireBinary(t, "terraform"))
	testutil.Eventually(t, 30*time.Second, func() bool {
		r, err := http.Get("http://" + tfAddr + "/healthz")
		if err == nil {
			r.Body.Close()
		}
		return err == nil
	}, "terraformer did not come up")
	e.kloud.Process.Signal(syscall.SIGTERM)
	e.kloud.Wait()
	e.extra = append(e.extra, "--terraformer-url", "http://"+tfAddr)
	e.start()
	if out := e.run("doctor"); strings.Contains(out, "FAILED") {
		t.Errorf("doctor with its own terraformer running:\n%s", out)
	}
	tf.Process.Signal(syscall.SIGTERM) // StartProcess reaps it
	testutil.Eventually(t, 30*time.Second, func() bool {
		r, err := http.Get("http://" + tfAddr + "/healthz")
		if err == nil {
			r.Body.Close()
		}
		return err != nil
	}, "terraformer did not stop")
	out, err := e.try("doctor")
	if err == nil || !strings.Contains(out, "terraformer") || !strings.Contains(out, "FAILED") || !strings.Contains(out, "fix: ") {
		t.Errorf("doctor with the terraformer stopped: err %v:\n%s", err, out)
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "FAILED") && !strings.HasPrefix(line, "terraformer ") {
			t.Errorf("doctor blames something else than the terraformer: %q", line)
		}
	}
	res.OK = true
	if out, err := e.try("doctor", "--json"); err == nil || json.NewDecoder(strings.NewReader(out)).Decode(&res) != nil || res.OK {
		t.Errorf("doctor --json with the terraformer stopped: err %v:\n%s", err, out)
	}

	e.alice()
	if out, err := e.try("doctor"); err == nil || !strings.Contains(out, "administrators") {
		t.Errorf("a member's doctor: err %v:\n%s", err, out)
	}
}
