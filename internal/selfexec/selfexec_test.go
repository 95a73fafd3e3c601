package selfexec

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestEnv re-executes this test binary with Env and checks what its GORACE says: under -race,
// atexit_sleep_ms=0 after the caller's own GORACE; otherwise nothing is added.
func TestEnv(t *testing.T) {
	if os.Getenv("SELFEXEC_CHILD") != "" {
		os.Stdout.WriteString(os.Getenv("GORACE"))
		os.Exit(0)
	}
	t.Setenv("GORACE", "halt_on_error=1")
	cmd := exec.Command("/proc/self/exe", "-test.run=^TestEnv$")
	cmd.Env = append(append(os.Environ(), "SELFEXEC_CHILD=1"), Env()...)
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	want := "halt_on_error=1"
	if raceEnabled {
		want += " atexit_sleep_ms=0"
	}
	if got := strings.TrimSpace(string(out)); got != want {
		t.Fatalf("GORACE in the child: %q, want %q", got, want)
	}
}
