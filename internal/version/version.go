// Package version holds the build's version, set at link time with
// -ldflags "-X github.com/kloud-dev/kloud/internal/version.Version=v1.2.3".
package version

// Version of this build.
var Version = "0.1.0-dev"
