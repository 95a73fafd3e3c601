package terraformer_test

import (
	"bytes"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/terraformer"
	"github.com/kloud-dev/kloud/terraformer/terraformertest"
	"github.com/kloud-dev/kloud/terraformer/tfrun"
	"github.com/kloud-dev/kloud/terraformer/tfrun/tfruntest"
)

// TestWithoutRoot runs the real terraformer as an unprivileged user (65534): it refuses to start,
// naming the reason and --insecure-no-sandbox; with that flag it serves, and terraform runs as
// terraformer's own user.
func TestWithoutRoot(t *testing.T) {
	t.Parallel()
	testutil.RequireRoot(t) // to start terraformer as another user
	tf, cfg := tfruntest.Setup(t)
	bin := testutil.BuildBinary(t, "./cmd/terraformer")
	keys := terraformertest.StartKeys(t)
	dataDir := t.TempDir()
	for _, d := range []string{filepath.Dir(dataDir), dataDir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(dataDir, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	addr := testutil.FreeLoopback(t)
	args := []string{"--addr", addr, "--data-dir", dataDir, "--kloud-url", keys.URL, "--terraform", tf, "--cli-config", cfg}
	command := func(extra ...string) *exec.Cmd {
		cmd := exec.Command(bin, append(args, extra...)...)
		cmd.Env = append(os.Environ(), "HOME="+dataDir)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
		return cmd
	}

	var stderr bytes.Buffer
	refused := command()
	refused.Stderr = &stderr
	err := refused.Run()
	if err == nil || !strings.Contains(stderr.String(), "needs root") || !strings.Contains(stderr.String(), "--insecure-no-sandbox") {
		t.Fatalf("terraformer as uid 65534 without --insecure-no-sandbox: %v\n%s", err, stderr.String())
	}
	t.Logf("refused: %s", strings.TrimSpace(stderr.String()))

	cmd := command("--insecure-no-sandbox")
	w := &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
	})
	testutil.Eventually(t, time.Minute, func() bool {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, "terraformer --insecure-no-sandbox never became healthy: %s", w)
	c := terraformertest.NewClient(t, "http://"+addr, keys.KiteKeyAuth("kloud"))
	run(t, c, tfrun.OpApply, terraformer.Request{ContentID: "dev", Files: files(`
resource "terraform_data" "x" {
  provisioner "local-exec" { command = "id -u > uid" }
}`)}, tfrun.StatusSucceeded)
	b, err := os.ReadFile(filepath.Join(dataDir, "stacks", "dev", "work", "uid"))
	if err != nil || strings.TrimSpace(string(b)) != "65534" {
		t.Fatalf("uid of terraform in --insecure-no-sandbox: %q %v", b, err)
	}
}
