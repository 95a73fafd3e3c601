package cli

import (
	"os"
	"path/filepath"
	"testing"
)

func TestServiceEndpoint(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]string{
		":7000":            "http://127.0.0.1:7000",
		"0.0.0.0:7000":     "http://127.0.0.1:7000",
		"[::]:7000":        "http://127.0.0.1:7000",
		"127.0.0.1:7000":   "http://127.0.0.1:7000",
		"127.0.0.2:7000":   "http://127.0.0.2:7000",
		"[::1]:7000":       "http://[::1]:7000",
		"10.200.0.1:7000":  "http://10.200.0.1:7000",
		"kloud.local:7000": "http://kloud.local:7000",
	} {
		if got, err := serviceEndpoint(addr); err != nil || got != want {
			t.Errorf("serviceEndpoint(%q) = %q, %v; want %q", addr, got, err, want)
		}
	}
	for _, bad := range []string{"7000", ":0", "127.0.0.1:"} {
		if got, err := serviceEndpoint(bad); err == nil {
			t.Errorf("serviceEndpoint(%q) = %q, want an error", bad, got)
		}
	}
}

// The instance id is created once per data dir, kept root-only, and the same on every start;
// another data dir has another one.
func TestInstanceID(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "data")
	id, err := instanceID(dir)
	if err != nil || !instanceRE.MatchString(id) {
		t.Fatalf("first start: %q %v", id, err)
	}
	st, err := os.Stat(filepath.Join(dir, InstanceIDFile))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("instance id file: %v %v", st, err)
	}
	if again, err := instanceID(dir); err != nil || again != id {
		t.Errorf("second start: %q %v, want %q", again, err, id)
	}
	if other, err := instanceID(t.TempDir()); err != nil || other == id {
		t.Errorf("another data dir: %q %v", other, err)
	}
	os.WriteFile(filepath.Join(dir, InstanceIDFile), []byte("../bad\n"), 0o600)
	if _, err := instanceID(dir); err == nil {
		t.Error("a malformed instance id was accepted")
	}
}
