package sandbox

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/kloud-dev/kloud/internal/cgroups"
	"github.com/kloud-dev/kloud/internal/selfexec"
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
	// Program is the binary the sandbox runs: terraform (terraformer/tfsandbox), a provider
	// plugin (kloud), ...
	Program string `json:"program"`
	// WorkDir is bound read-write at its own path and is the program's working directory. Empty:
	// no work directory (it runs in /tmp), as for `terraform version`.
	WorkDir string `json:"workDir,omitempty"`
	// ReadOnly paths are bound read-only at their own paths: the CLI config file, the provider
	// mirrors, extra paths. The Program binary is added by the launcher.
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

// Env returns the environment variables that make the launcher run the program with c; pass them
// (with the rest of its environment) to the launcher (terraform-exec's SetEnv, exec.Cmd.Env). run
// is a token that [Kill] finds the command's processes by.
func (c Config) Env(run string) (map[string]string, error) {
	if c.Program == "" {
		return nil, errors.New("sandbox: no program")
	}
	b, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	env := map[string]string{envStage: stageLaunch, envConfig: string(b), EnvRun: run}
	for _, kv := range selfexec.Env() { // the launcher and init are this binary again
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	return env, nil
}

var installed atomic.Bool

// MaybeRun must be the first statement of main() in every program that runs something in the
// sandbox (cmd/terraformer and cmd/kloud, test binaries via TestMain, bench tools): the program
// is re-executed as the launcher. In a normal run it returns at once; as the launcher or its init it does that
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
		return nil, fmt.Errorf("sandbox: parse %s: %w", envConfig, err)
	}
	c.defaults()
	return &c, nil
}
