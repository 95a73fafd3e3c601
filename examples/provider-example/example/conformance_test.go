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
)

// The example passes the conformance suite in kloud's process and as the plugin binary
// kloud-provider-example (launched by the test kloud, sandboxed as uid 65534: its machines run
// as that user). Its machines are directories of the provider's state dir
// (<state>/machines/<stack>/<label>) and the processes marked with that directory.
func TestConformance(t *testing.T) {
	t.Parallel()
	t.Run("InProcess", func(t *testing.T) {
		t.Parallel()
		state := filepath.Join(t.TempDir(), "state")
		conformance(t, state, providertest.Config{Provider: example.New(example.Options{Dir: state, Logger: testutil.Logger(t)})})
	})
	t.Run("Plugin", func(t *testing.T) {
		t.Parallel()
		data := t.TempDir()
		// The launcher gives plugin NAME the state directory <data dir>/plugin-state/NAME.
		state := filepath.Join(data, "plugin-state", "example")
		conformance(t, state, providertest.Config{
			Plugin: testutil.BuildBinary(t, "./examples/provider-example"), Name: "example",
			Kloud: kloudtest.Options{DataDir: data},
		})
	})
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
