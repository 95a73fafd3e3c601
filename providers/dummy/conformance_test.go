package dummy_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/e2e/providertest"
	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/dummy"
	"github.com/kloud-dev/kloud/userdata"
)

// The dummy provider passes the conformance suite: its machines are klient processes on this
// host, each with a directory of its own (Dir/<stack>/<label>) as its root. Advertising less
// (no stop), it passes too: kloud refuses machine.stop (-32005) and the suite skips what needs
// it.
func TestConformance(t *testing.T) {
	// Independent (a kloud and machines each): in parallel, as most of their time is waiting.
	t.Run("All", func(t *testing.T) {
		t.Parallel()
		conformance(t, nil)
	})
	t.Run("NoStop", func(t *testing.T) {
		t.Parallel()
		conformance(t, []provider.Capability{provider.CapStart, provider.CapInfo, provider.CapConsoleLog, provider.CapBootstrap})
	})
}

func conformance(t *testing.T, caps []provider.Capability) {
	dir := filepath.Join(t.TempDir(), "machines")
	root := func(m providertest.Machine) string { return filepath.Join(dir, m.StackID, m.Label) }
	t.Cleanup(func() { killMachines(dir) })
	p := dummy.New(dummy.Options{Dir: dir, Logger: testutil.Logger(t)})
	p.Capabilities = caps
	providertest.Run(t, providertest.Config{
		Provider:       p,
		GoodCredential: json.RawMessage(`{"token":"s3cret-token"}`),
		BadCredential:  json.RawMessage(`{"token":"invalid"}`),
		BadReason:      "the API rejected the token",
		Template: func(n int) map[string]string {
			return map[string]string{"main.tf": fmt.Sprintf(`
resource "terraform_data" "vm" {
  count = %d
  input = "#!/bin/bash\necho hello from $(hostname)"
}
`, n)}
		},
		// As a crash would: the machine's agent and its supervisor killed.
		StopBehindBack: func(t *testing.T, m providertest.Machine) {
			b, err := os.ReadFile(filepath.Join(root(m), userdata.SupervisorPIDPath))
			if err != nil {
				t.Fatal(err)
			}
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil || pid <= 1 {
				t.Fatalf("supervisor pid of %s: %q", m.Label, b)
			}
			if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil {
				t.Fatalf("kill the supervisor of %s: %v", m.Label, err)
			}
			testutil.Eventually(t, 10*time.Second, func() bool { return !alive(pid) }, "supervisor %d of %s still runs", pid, m.Label)
		},
		WriteFile: func(t *testing.T, m providertest.Machine, path, data string) {
			if err := os.WriteFile(filepath.Join(root(m), path), []byte(data), 0o644); err != nil {
				t.Fatal(err)
			}
		},
		ReadFile: func(t *testing.T, m providertest.Machine, path string) string {
			b, err := os.ReadFile(filepath.Join(root(m), path))
			if err != nil {
				t.Fatal(err)
			}
			return string(b)
		},
		Leftovers: func(t *testing.T) []string { return dummyLeftovers(t, dir) },
	})
}

// dummyLeftovers lists the machine directories under dir (dir/<stack>/<label>) and the live
// processes of machines under dir (marked by KLOUD_DUMMY_MACHINE in their environment).
func dummyLeftovers(t *testing.T, dir string) []string {
	var out []string
	stacks, _ := os.ReadDir(dir)
	for _, s := range stacks {
		if !s.IsDir() {
			continue // the token key
		}
		ms, _ := os.ReadDir(filepath.Join(dir, s.Name()))
		for _, m := range ms {
			out = append(out, "machine "+s.Name()+"/"+m.Name())
		}
	}
	for _, pid := range machineProcs(dir) {
		out = append(out, "process "+strconv.Itoa(pid))
	}
	return out
}

// machineProcs returns the live processes of machines under dir.
func machineProcs(dir string) []int {
	entries, _ := os.ReadDir("/proc")
	marker := []byte("KLOUD_DUMMY_MACHINE=" + dir + "/")
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || !alive(pid) {
			continue
		}
		env, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err == nil && bytes.Contains(env, marker) {
			out = append(out, pid)
		}
	}
	return out
}

// killMachines kills what a failed test left running of machines under dir.
func killMachines(dir string) {
	for _, pid := range machineProcs(dir) {
		syscall.Kill(pid, syscall.SIGKILL)
	}
}
