package cli

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/providers/vagrant"
)

// kloud serve says whether this host could be a vagrant host, and what is missing.
func TestVagrantHostNote(t *testing.T) {
	v, err := vagrant.New(vagrant.Options{StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	sv := &serveVagrant{v: v}
	bin := t.TempDir()
	t.Setenv("PATH", bin)
	if n := sv.hostNote("/data"); !strings.Contains(n, "has no vagrant") {
		t.Errorf("without vagrant: %q", n)
	}
	if err := os.WriteFile(filepath.Join(bin, "vagrant"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "d.sock")
	t.Setenv("DOCKER_HOST", "unix://"+sock)
	if n := sv.hostNote("/data"); !strings.Contains(n, "no Docker daemon answers at "+sock) {
		t.Errorf("without dockerd: %q", n)
	}
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if n := sv.hostNote("/data"); !strings.Contains(n, "run: klient --vagrant --kite-key KEY") || !strings.Contains(n, "/data/admin.key") {
		t.Errorf("with vagrant and dockerd: %q", n)
	}
	if n := (&serveVagrant{}).hostNote("/data"); n != "" {
		t.Errorf("--no-vagrant: %q", n)
	}
}
