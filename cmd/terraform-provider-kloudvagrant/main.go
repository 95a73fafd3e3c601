// Command terraform-provider-kloudvagrant is the Terraform provider for Vagrant machines on a
// user's own host; see package providers/vagrant/tfprovider. Terraform starts it;
// scripts/build-kloudvagrant.sh installs it into the offline provider mirror. It needs no
// privilege: it asks kloud's vagrant machine service, which asks the owner's klient --vagrant.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/kloud-dev/kloud/providers/vagrant/tfprovider"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "--version" {
		fmt.Println(tfprovider.Address, tfprovider.Version)
		return
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if err := tfprovider.Serve(context.Background(), tfprovider.Options{Logger: logger}); err != nil {
		fmt.Fprintln(os.Stderr, "terraform-provider-kloudvagrant:", err)
		os.Exit(1)
	}
}
