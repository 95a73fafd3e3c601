// Package tfsandbox is the terraform-specific layer of internal/sandbox, the launcher terraformer
// gives terraform-exec as "the terraform binary": what a Terraform CLI config needs visible
// (CLIConfigPaths), and the sandbox's names for the engine (terraformer/tfrun) and tests. The
// sandbox itself (namespaces, the minimal root, cgroups, the privilege drop) is internal/sandbox:
// start reading there.
package tfsandbox

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/kloud-dev/kloud/internal/sandbox"
)

// The sandbox's names (internal/sandbox).
type Config = sandbox.Config

// EnvRun carries a per-command token (sandbox.EnvRun).
const EnvRun = sandbox.EnvRun

// DefaultUID and DefaultGID are nobody and nogroup on Debian.
const (
	DefaultUID = sandbox.DefaultUID
	DefaultGID = sandbox.DefaultGID
)

// Cgroup name prefixes: terraform runs (terraformer) and provider plugins (kloud).
const (
	CgroupPrefixTerraform = sandbox.CgroupPrefixTerraform
	CgroupPrefixPlugin    = sandbox.CgroupPrefixPlugin
)

// DefaultTerraformLimits are the limits terraformer serve uses unless told otherwise
// (--terraform-* flags).
var DefaultTerraformLimits = sandbox.DefaultTerraformLimits

// MaybeRun must be the first statement of main() in every program that runs terraform through
// tfrun (cmd/terraformer, test binaries via TestMain, bench tools): tfrun re-executes the program
// as the launcher. It is sandbox.MaybeRun.
func MaybeRun() { sandbox.MaybeRun() }

// Installed reports whether this program called MaybeRun.
func Installed() bool { return sandbox.Installed() }

// Check says whether this process can build the sandbox (it must be root).
func Check() error { return sandbox.Check() }

// Kill kills the processes of run (sandbox.Kill).
func Kill(run string) int { return sandbox.Kill(run) }

// RemoveCgroup removes the cgroup of run (sandbox.RemoveCgroup).
func RemoveCgroup(c Config, run string) error { return sandbox.RemoveCgroup(c, run) }

// RemoveLeftovers removes the empty cgroups killed launchers left (sandbox.RemoveLeftovers).
func RemoveLeftovers(prefix string) ([]string, error) { return sandbox.RemoveLeftovers(prefix) }

// RemoveTestLeftovers is for a test binary's TestMain after m.Run: the empty groups of the runs
// and plugins its tests killed (sandbox.RemoveTestLeftovers).
func RemoveTestLeftovers() { sandbox.RemoveTestLeftovers() }

// RemoveLeftoversOlder is RemoveLeftovers of the groups made more than age ago.
func RemoveLeftoversOlder(prefix string, age time.Duration) ([]string, error) {
	return sandbox.RemoveLeftoversOlder(prefix, age)
}

var (
	mirrorPathRe = regexp.MustCompile(`(?m)^\s*path\s*=\s*"([^"]+)"`)
	cacheDirRe   = regexp.MustCompile(`(?m)^\s*plugin_cache_dir\s*=\s*"([^"]+)"`)
)

// CLIConfigPaths returns what the Terraform CLI config file at path needs visible besides itself:
// the `path` of its filesystem_mirror blocks and its plugin_cache_dir, those that exist.
func CLIConfigPaths(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read cli config: %w", err)
	}
	b = stripComments(b)
	var out []string
	for _, re := range []*regexp.Regexp{mirrorPathRe, cacheDirRe} {
		for _, m := range re.FindAllSubmatch(b, -1) {
			p := string(m[1])
			if !filepath.IsAbs(p) {
				continue // relative to terraform's cwd: the work dir, which is visible anyway
			}
			if _, err := os.Stat(p); err != nil {
				continue
			}
			p = filepath.Clean(p)
			out = append(out, p)
			out = append(out, linkTargets(p)...)
		}
	}
	return out, nil
}

// linkTargets returns where the symlinks under dir point outside dir (a provider in a mirror may
// be a symlink to its build), so that they resolve in the sandbox too.
func linkTargets(dir string) []string {
	var out []string
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.Type()&fs.ModeSymlink == 0 {
			return nil
		}
		target, err := filepath.EvalSymlinks(p)
		if err != nil {
			return nil
		}
		if rel, err := filepath.Rel(dir, target); err != nil || strings.HasPrefix(rel, "..") {
			out = append(out, target)
		}
		return nil
	})
	return out
}

func stripComments(b []byte) []byte {
	var out [][]byte
	for _, line := range bytes.Split(b, []byte("\n")) {
		t := bytes.TrimSpace(line)
		if bytes.HasPrefix(t, []byte("#")) || bytes.HasPrefix(t, []byte("//")) {
			continue
		}
		out = append(out, line)
	}
	return bytes.Join(out, []byte("\n"))
}
