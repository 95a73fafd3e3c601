package tfsandbox

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/kloud-dev/kloud/internal/cgroups"
)

const (
	envStage  = "KLOUD_TFSANDBOX_STAGE"
	envConfig = "KLOUD_TFSANDBOX_CONFIG"
	// EnvRun carries a per-command token; it stays in the launcher's and init's environment (not
	// in terraform's, unless Insecure) so that Kill can find them.
	EnvRun = "KLOUD_TFSANDBOX_RUN"

	stageLaunch = "launch"
	stageInit   = "init"

	// DefaultUID and DefaultGID are nobody and nogroup on Debian.
	DefaultUID = 65534
	DefaultGID = 65534
)

// Config is what the launcher is told, as JSON in an environment variable (see [Config.Env]).
type Config struct {
	// Terraform is the real terraform binary.
	Terraform string `json:"terraform"`
	// WorkDir is bound read-write at its own path and is terraform's working directory. Empty:
	// no work directory (terraform runs in /tmp), as for `terraform version`.
	WorkDir string `json:"workDir,omitempty"`
	// ReadOnly paths are bound read-only at their own paths: the CLI config file, the provider
	// mirrors, extra paths. The terraform binary is added by the launcher.
	ReadOnly []string `json:"readOnly,omitempty"`
	// UID and GID terraform runs as. Zero: DefaultUID / DefaultGID (never root).
	UID int `json:"uid,omitempty"`
	GID int `json:"gid,omitempty"`
	// Insecure: exec terraform directly, without namespaces or privilege drop (development only).
	Insecure bool `json:"insecure,omitempty"`
	// PTY gives the sandbox terminals of its own: a private devpts instance at /dev/pts (new
	// instance: none of the host's terminals are visible) and /dev/ptmx. For a program that
	// opens pseudo-terminals, such as a provider plugin whose machines' agents serve web
	// terminals; terraform does not need it.
	PTY bool `json:"pty,omitempty"`
	// Limits, if set, run the sandbox in a cgroup of its own with these limits (cpu, memory,
	// pids; see cgroup.go), named kloud/<CgroupPrefix><run token>. Not with Insecure.
	Limits *cgroups.Limits `json:"limits,omitempty"`
	// CgroupPrefix names the group (default CgroupPrefixTerraform).
	CgroupPrefix string `json:"cgroupPrefix,omitempty"`
}

func (c *Config) defaults() {
	if c.UID <= 0 {
		c.UID = DefaultUID
	}
	if c.GID <= 0 {
		c.GID = DefaultGID
	}
}

// Env returns the environment variables that make the launcher run terraform with c; pass them
// (with the rest of terraform's environment) to terraform-exec's SetEnv. run is a token that
// [Kill] finds the command's processes by.
func (c Config) Env(run string) (map[string]string, error) {
	if c.Terraform == "" {
		return nil, errors.New("tfsandbox: no terraform binary")
	}
	b, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("tfsandbox: %w", err)
	}
	return map[string]string{envStage: stageLaunch, envConfig: string(b), EnvRun: run}, nil
}

var installed atomic.Bool

// MaybeRun must be the first statement of main() in every program that runs terraform through
// tfrun (cmd/terraformer, test binaries via TestMain, bench tools): tfrun re-executes the program
// as the launcher. In a normal run it returns at once; as the launcher or its init it does that
// job and exits.
func MaybeRun() {
	switch os.Getenv(envStage) {
	case stageLaunch:
		os.Exit(launch())
	case stageInit:
		os.Exit(runInit())
	}
	installed.Store(true)
}

// Installed reports whether this program called MaybeRun, i.e. whether it can be its own launcher.
func Installed() bool { return installed.Load() }

// Check says whether this process can build the sandbox: it must be root (namespaces, mounts,
// the uid change).
func Check() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("the terraform sandbox needs root (pid and mount namespaces, a uid change); this process runs as uid %d", os.Geteuid())
	}
	return nil
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

// Kill sends SIGKILL to every process whose environment carries EnvRun=run (the launcher and
// init of one command; in Insecure mode terraform and what it started) and returns how many it
// signalled. Killing the launcher is enough to end a sandboxed command: the kernel kills the rest.
func Kill(run string) int {
	if run == "" {
		return 0
	}
	want := []byte(EnvRun + "=" + run + "\x00")
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	n := 0
	for _, ent := range entries {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		env, err := os.ReadFile("/proc/" + ent.Name() + "/environ")
		if err != nil || !bytes.Contains(append(env, 0), want) {
			continue
		}
		if syscall.Kill(pid, syscall.SIGKILL) == nil {
			n++
		}
	}
	return n
}

// envWithout returns os.Environ() without the launcher's variables (and, unless keepRun, the run
// token).
func envWithout(keepRun bool) []string {
	var out []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if name == envStage || name == envConfig || (name == EnvRun && !keepRun) {
			continue
		}
		out = append(out, kv)
	}
	return out
}

func readConfig() (*Config, error) {
	var c Config
	if err := json.Unmarshal([]byte(os.Getenv(envConfig)), &c); err != nil {
		return nil, fmt.Errorf("tfsandbox: parse %s: %w", envConfig, err)
	}
	c.defaults()
	return &c, nil
}
