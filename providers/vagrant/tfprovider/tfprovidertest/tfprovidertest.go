// Package tfprovidertest gives tests the kloudvagrant Terraform provider built from this tree in a
// private provider mirror. Start with Terraform; call Cleanup from TestMain after m.Run.
package tfprovidertest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/providers/vagrant/tfprovider"
	"github.com/kloud-dev/kloud/terraformer/tfrun/tfruntest"
)

var build struct {
	once      sync.Once
	dir       string // run dir holding the mirror and the CLI config
	remove    func()
	cliConfig string
	err       error
}

// Terraform returns the terraform binary (tfruntest.Setup's) and a CLI config file whose only
// provider source is a temporary filesystem mirror holding kloudvagrant, built from this tree once
// per test process.
func Terraform(t testing.TB) (terraformPath, cliConfig string) {
	t.Helper()
	terraformPath, _ = tfruntest.Setup(t)
	build.once.Do(func() { build.dir, build.cliConfig, build.err = buildMirror() })
	if build.err != nil {
		t.Fatalf("build the kloudvagrant provider: %s", build.err)
	}
	return terraformPath, build.cliConfig
}

// Cleanup removes the temporary mirror; call it from TestMain after m.Run. (A test binary killed
// before it leaves the mirror in testutil.RunDir's directory, which the next run removes; never
// in the system temp dir.)
func Cleanup() {
	if build.remove != nil {
		build.remove()
	}
}

func buildMirror() (dir, cliConfig string, err error) {
	root, err := testutil.ModuleRoot()
	if err != nil {
		return "", "", err
	}
	dir, build.remove, err = testutil.RunDir("kloudvagrant-mirror")
	if err != nil {
		return "", "", err
	}
	if err := os.Chmod(dir, 0o755); err != nil { // readable by tests that run terraform as another user
		return dir, "", err
	}
	platform := runtime.GOOS + "_" + runtime.GOARCH
	pdir := filepath.Join(dir, "mirror", "registry.terraform.io", "kloud", tfprovider.Name, tfprovider.Version, platform)
	if err := os.MkdirAll(pdir, 0o755); err != nil {
		return dir, "", err
	}
	bin := filepath.Join(pdir, "terraform-provider-"+tfprovider.Name+"_v"+tfprovider.Version)
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/terraform-provider-kloudvagrant")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return dir, "", fmt.Errorf("go build: %w\n%s", err, out)
	}
	cliConfig = filepath.Join(dir, "terraform.tfrc")
	cfg := fmt.Sprintf(`provider_installation {
  filesystem_mirror {
    path    = %q
    include = ["registry.terraform.io/kloud/*"]
  }
  direct {
    exclude = ["registry.terraform.io/*/*"]
  }
}
disable_checkpoint = true
`, filepath.Join(dir, "mirror"))
	return dir, cliConfig, os.WriteFile(cliConfig, []byte(cfg), 0o644)
}
