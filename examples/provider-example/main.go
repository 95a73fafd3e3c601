// Command kloud-provider-example is the example provider (package example) as a kloud plugin:
// kloud starts it from its plugin directory (or you start it anywhere with a provider key), it
// dials kloud and serves the provider over that connection.
//
//	go build -o kloud-provider-example ./examples/provider-example
//	kloud provider install ./kloud-provider-example
//
// Copy this directory to start your own provider: main stays this small.
package main

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/kloud-dev/kloud/examples/provider-example/example"
	"github.com/kloud-dev/kloud/provider/plugin"
)

func main() {
	// kloud gives a plugin it launches a directory of its own to write; a plugin started by hand
	// (remote) keeps its machines in the home directory.
	dir := os.Getenv(plugin.EnvStateDir)
	if dir == "" {
		home, _ := os.UserHomeDir()
		dir = filepath.Join(home, ".kloud-provider-example")
	}
	// Whatever the plugin writes to stderr ends up in kloud's log, tagged with its name.
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	// Buckets on an S3 server, if configured: s3.json in the state directory, or the
	// environment of a plugin started by hand (example.LoadS3). Without, no capability "bucket".
	s3, err := example.LoadS3(dir, os.Getenv)
	if err != nil {
		log.Error("the S3 server for buckets", "err", err)
		os.Exit(1)
	}
	o := example.Options{Dir: dir, Logger: log, S3: s3}
	// The machines are processes that died with the previous process of the plugin (kloud's
	// sandbox ends everything of a plugin with it): power on again those that were on.
	if n, err := example.Resume(context.Background(), o); err != nil {
		log.Warn("machines not powered on again after a restart", "powered on", n, "err", err)
	} else if n > 0 {
		log.Info("machines powered on again after a restart", "machines", n)
	}
	plugin.Serve(example.New(o))
}
