package example_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/e2e/providertest"
	"github.com/kloud-dev/kloud/examples/provider-example/example"
	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/objstore/seaweed"
	"github.com/kloud-dev/kloud/objstore/seaweed/seaweedtest"
)

// The example passes the conformance suite in kloud's process and as the plugin binary
// kloud-provider-example (launched by the test kloud, sandboxed as uid 65534: its machines run
// as that user). Its machines are directories of the provider's state dir
// (<state>/machines/<stack>/<label>) and the processes marked with that directory. With a
// SeaweedFS server (seaweedtest: KLOUD_WEED, or CI=true), it provisions buckets on it and passes
// the Bucket case too: in process with the server's provisioner, as a plugin configured by an
// s3.json in its state directory (over the plugin wire).
func TestConformance(t *testing.T) {
	t.Parallel()
	srv := s3Server(t)
	t.Run("InProcess", func(t *testing.T) {
		t.Parallel()
		state := filepath.Join(t.TempDir(), "state")
		o := example.Options{Dir: state, Logger: testutil.Logger(t)}
		if srv != nil {
			o.Buckets = srv.Provisioner("example-conf-" + randomHex(4))
		}
		conformance(t, state, providertest.Config{Provider: example.New(o)})
	})
	t.Run("Plugin", func(t *testing.T) {
		t.Parallel()
		data := t.TempDir()
		// The launcher gives plugin NAME the state directory <data dir>/plugin-state/NAME.
		state := filepath.Join(data, "plugin-state", "example")
		if srv != nil {
			writeS3File(t, state, s3Config(t, srv, state))
		}
		conformance(t, state, providertest.Config{
			Plugin: testutil.BuildBinary(t, "./examples/provider-example"), Name: "example",
			Kloud: kloudtest.Options{DataDir: data},
		})
	})
}

// s3Server returns the test process's SeaweedFS server, or nil (no buckets) where weed is not
// configured (KLOUD_WEED unset) and CI is not set: the rest of the suite does not need it.
func s3Server(t *testing.T) *seaweed.Server {
	if os.Getenv(seaweedtest.EnvWeed) == "" && os.Getenv("CI") != "true" {
		t.Log("KLOUD_WEED is not set: the example runs without buckets (the Bucket case skips)")
		return nil
	}
	return seaweedtest.Start(t)
}

func conformance(t *testing.T, state string, c providertest.Config) {
	dir := func(m providertest.Machine) string { return filepath.Join(state, "machines", m.StackID, m.Label) }
	t.Cleanup(func() {
		for _, pid := range machineProcs(state + "/") {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	c.GoodCredential = json.RawMessage(`{"label":"conf","maxMachines":2}`)
	c.BadCredential = json.RawMessage(`{"label":"conf","maxMachines":16}`)
	c.BadReason = "more than this host allows"
	c.Template = func(n int) map[string]string {
		return map[string]string{"main.tf": fmt.Sprintf(`
resource "terraform_data" "vm" {
  count = %d
  input = "#!/bin/bash\necho hello"
}
`, n)}
	}
	// As a crash (or a restarted plugin) would: every process of the machine killed.
	c.StopBehindBack = func(t *testing.T, m providertest.Machine) {
		for _, pid := range machineProcs(dir(m)) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		testutil.Eventually(t, 10*time.Second, func() bool { return len(machineProcs(dir(m))) == 0 }, "processes of %s still run", m.Label)
	}
	// The disk: the owner's home directory in the machine.
	home := func(m providertest.Machine, path string) string {
		return filepath.Join(dir(m), "home", m.Owner, path)
	}
	c.WriteFile = func(t *testing.T, m providertest.Machine, path, data string) {
		if err := os.WriteFile(home(m, path), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	c.ReadFile = func(t *testing.T, m providertest.Machine, path string) string {
		b, err := os.ReadFile(home(m, path))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	c.Leftovers = func(t *testing.T) []string {
		var out []string
		stacks, _ := os.ReadDir(filepath.Join(state, "machines"))
		for _, s := range stacks {
			ms, _ := os.ReadDir(filepath.Join(state, "machines", s.Name()))
			for _, m := range ms {
				out = append(out, "machine "+s.Name()+"/"+m.Name())
			}
		}
		for _, pid := range machineProcs(state + "/") {
			out = append(out, "process "+strconv.Itoa(pid))
		}
		slices.Sort(out)
		return out
	}
	providertest.Run(t, c)
}
