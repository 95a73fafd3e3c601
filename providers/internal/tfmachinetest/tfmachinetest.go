// Package tfmachinetest gives tests a machine service's Terraform provider (kloudlocal,
// kloudvagrant) built from this tree into a private provider mirror. Start with Mirror; the
// providers' own tfprovidertest packages hold one each.
package tfmachinetest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/terraformer/tfrun/tfruntest"
)

// Mirror is a Terraform provider of kloud/<Name> at Version, built from the main package Cmd
// ("./cmd/terraform-provider-kloudlocal") once per test process.
type Mirror struct {
	Name, Version, Cmd string

	once      sync.Once
	remove    func()
	cliConfig string
	err       error
}

// Terraform returns the terraform binary (tfruntest.Setup's) and a CLI config file whose only
// provider source is a temporary filesystem mirror holding the provider.
func (m *Mirror) Terraform(t testing.TB) (terraformPath, cliConfig string) {
	t.Helper()
	terraformPath, _ = tfruntest.Setup(t)
	m.once.Do(func() { m.cliConfig, m.err = m.build() })
	if m.err != nil {
		t.Fatalf("build the %s provider: %s", m.Name, m.err)
	}
	return terraformPath, m.cliConfig
}

// Cleanup removes the temporary mirror; call it from TestMain after m.Run. (A test binary killed
// before it leaves the mirror in testutil.RunDir's directory, which the next run removes; never
// in the system temp dir.)
func (m *Mirror) Cleanup() {
	if m.remove != nil {
		m.remove()
	}
}

func (m *Mirror) build() (cliConfig string, err error) {
	root, err := testutil.ModuleRoot()
	if err != nil {
		return "", err
	}
	dir, remove, err := testutil.RunDir(m.Name + "-mirror")
	if err != nil {
		return "", err
	}
	m.remove = remove
	if err := os.Chmod(dir, 0o755); err != nil { // readable by tests that run terraform as another user
		return "", err
	}
	platform := runtime.GOOS + "_" + runtime.GOARCH
	pdir := filepath.Join(dir, "mirror", "registry.terraform.io", "kloud", m.Name, m.Version, platform)
	if err := os.MkdirAll(pdir, 0o755); err != nil {
		return "", err
	}
	bin := filepath.Join(pdir, "terraform-provider-"+m.Name+"_v"+m.Version)
	cmd := exec.Command("go", "build", "-o", bin, m.Cmd)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %w\n%s", err, out)
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
	return cliConfig, os.WriteFile(cliConfig, []byte(cfg), 0o644)
}
