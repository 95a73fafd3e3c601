package dummy

import (
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestKillAll: KillAll ends the processes of machines under its directory (also a child they
// started) and leaves those of a directory beside it alone.
func TestKillAll(t *testing.T) {
	dir := t.TempDir()
	start := func(root string) *exec.Cmd {
		// sh starts a sleep of its own: both carry the machine's mark.
		c := exec.Command("sh", "-c", "sleep 60 & wait")
		c.Env = machineEnv(root)
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Process.Kill(); c.Wait() })
		return c
	}
	in := start(filepath.Join(dir, "machines", "s1", "dev.0"))
	out := start(filepath.Join(dir, "machines-other", "s1", "dev.0"))
	for deadline := time.Now().Add(10 * time.Second); len(machineProcs(filepath.Join(dir, "machines", "s1", "dev.0"))) < 2; {
		if time.Now().After(deadline) {
			t.Fatal("the machine's two processes did not start")
		}
		time.Sleep(10 * time.Millisecond)
	}

	if err := KillAll(t.Context(), filepath.Join(dir, "machines")); err != nil {
		t.Fatal(err)
	}
	if n := machineProcs(filepath.Join(dir, "machines", "s1", "dev.0")); len(n) != 0 {
		t.Fatalf("processes of a machine under the directory still run: %v", n)
	}
	in.Wait()
	if err := out.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("a machine beside the directory was killed: %v", err)
	}
}
