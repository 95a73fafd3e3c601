// Package tfprovidertest gives tests the kloudvagrant Terraform provider built from this tree in a
// private provider mirror (tfmachinetest.Mirror). Start with Terraform; call Cleanup from
// TestMain after m.Run.
package tfprovidertest

import (
	"testing"

	"github.com/kloud-dev/kloud/providers/internal/tfmachinetest"
	"github.com/kloud-dev/kloud/providers/vagrant/tfprovider"
)

var mirror = &tfmachinetest.Mirror{Name: tfprovider.Name, Version: tfprovider.Version, Cmd: "./cmd/terraform-provider-kloudvagrant"}

// Terraform returns the terraform binary (tfruntest.Setup's) and a CLI config file whose only
// provider source is a temporary filesystem mirror holding kloudvagrant, built from this tree once
// per test process.
func Terraform(t testing.TB) (terraformPath, cliConfig string) {
	t.Helper()
	return mirror.Terraform(t)
}

// Cleanup removes the temporary mirror; call it from TestMain after m.Run.
func Cleanup() { mirror.Cleanup() }
