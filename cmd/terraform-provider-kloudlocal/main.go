// Command terraform-provider-kloudlocal is the Terraform provider for local namespace machines; see
// package tfprovider. Terraform starts it; scripts/build-kloudlocal.sh installs it into the
// offline provider mirror. It needs no privilege: it asks kloud's local machine service to create
// and destroy machines.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/kloud-dev/kloud/providers/local/tfprovider"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "--version" {
		fmt.Println(tfprovider.Address, tfprovider.Version)
		return
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if err := tfprovider.Serve(context.Background(), tfprovider.Options{Logger: logger}); err != nil {
		fmt.Fprintln(os.Stderr, "terraform-provider-kloudlocal:", err)
		os.Exit(1)
	}
}
