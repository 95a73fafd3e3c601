// Package dummy is a test-only provider whose "machines" are klient processes on the kloud host.
//
// Start with New: each test makes its own provider (no globals). A machine is a `terraform_data`
// resource whose `input` is the machine's user data (a shell script). At apply, kloud's
// InjectUserData replaces it with the agent's provisioning script (userdata.RenderScript), and
// the provider adds, for every machine, a `terraform_data.kloud_boot_<name>` resource whose
// local-exec provisioner "boots" the machine: it runs that script with a directory of the host
// as the machine's root. The script downloads klient from kloud (checksum checked), starts it,
// and runs the user's script — exactly what cloud-init does on a VM — so the planner and the
// whole build flow are tested against real agents. Destroy kills the machine's processes and
// removes its directory. Failures are scriptable (Options.Fail, Options.BreakAgent).
package dummy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/userdata"
)

// Options configure a dummy provider.
type Options struct {
	Name string // default "dummy"
	Dir  string // required: machines live in Dir/<stack id>/<label>
	// Fail makes the named methods fail with the given error: VerifyCredential,
	// BootstrapTemplates, ApplyTemplate, Start, Stop, Info.
	Fail map[string]error
	// BreakAgent breaks the agent install: "download" gives machines a wrong klient checksum.
	BreakAgent string
}

// Credential is the dummy's credential: a token that must not be "invalid", and a region.
type Credential struct {
	Token  string `json:"token" kloud:"API token,secret,required"`
	Region string `json:"region" kloud:"Region" default:"local-1"`
}

// Valid implements the schema's validation.
func (c *Credential) Valid() error {
	if len(c.Token) < 3 {
		return errors.New("token is too short")
	}
	return nil
}

// Bootstrap is what the dummy's bootstrap template outputs.
type Bootstrap struct {
	NetworkID string `json:"network_id" kloud:"Network"`
}

// New returns a dummy provider.
func New(o Options) *provider.Provider {
	if o.Name == "" {
		o.Name = "dummy"
	}
	d := &dummy{o: o}
	return &provider.Provider{
		Name: o.Name, ResourceType: "terraform_data", UserDataAttr: "input",
		Description: "test provider: machines are klient processes on the kloud host",
		Schema: provider.Schema{
			NewCredential: func() any { return &Credential{} },
			NewBootstrap:  func() any { return &Bootstrap{} },
		},
		Stack:   func(b *provider.BaseStack) (provider.Stack, error) { return &stack{d: d, b: b}, nil },
		Machine: func(b *provider.BaseMachine) (provider.Machine, error) { return &machine{d: d, b: b}, nil },
	}
}

type dummy struct{ o Options }

func (d *dummy) fail(method string) error {
	if err, ok := d.o.Fail[method]; ok {
		return fmt.Errorf("dummy.%s: %w", method, err)
	}
	return nil
}

func (d *dummy) root(stackID, label string) string { return filepath.Join(d.o.Dir, stackID, label) }

type stack struct {
	d *dummy
	b *provider.BaseStack
}

func (s *stack) VerifyCredential(ctx context.Context, c *provider.Credential) error {
	if err := s.d.fail("VerifyCredential"); err != nil {
		return err
	}
	cr, ok := c.Value.(*Credential)
	if !ok {
		return fmt.Errorf("dummy: credential of type %T", c.Value)
	}
	if cr.Token == "invalid" {
		return errors.New("dummy: the API rejected the token")
	}
	return nil
}

func (s *stack) BootstrapTemplates(ctx context.Context, c *provider.Credential) ([]*provider.Template, error) {
	if err := s.d.fail("BootstrapTemplates"); err != nil {
		return nil, err
	}
	cr := c.Value.(*Credential)
	main := fmt.Sprintf(`resource "terraform_data" "network" {
  input = %q
}
output "network_id" {
  value = "net-${terraform_data.network.id}"
}
`, cr.Region)
	return []*provider.Template{{Files: map[string][]byte{"bootstrap.tf": []byte(main)}}}, nil
}

func (s *stack) ApplyTemplate(ctx context.Context, c *provider.Credential) (*provider.Template, error) {
	if err := s.d.fail("ApplyTemplate"); err != nil {
		return nil, err
	}
	roots := map[string][]string{} // resource → machine roots in index order
	counted := map[string]bool{}
	err := s.b.InjectUserData(ctx, func(m *provider.MachineSpec, cfg userdata.Config) ([]byte, error) {
		if s.d.o.BreakAgent == "download" {
			cfg.KlientSHA256 = strings.Repeat("0", 64)
		}
		root := s.d.root(s.b.StackID, m.Label)
		roots[m.Resource] = append(roots[m.Resource], root)
		counted[m.Resource] = m.Index != nil
		return userdata.RenderScript(cfg, root)
	})
	if err != nil {
		return nil, err
	}
	vars := map[string]any{}
	res := map[string]any{}
	for _, name := range slices.Sorted(maps.Keys(roots)) {
		rv := "kloud_dummy_roots_" + name
		inst, idx := "terraform_data."+name, "0"
		if counted[name] {
			inst, idx = inst+"[count.index]", "count.index"
		}
		vars[rv] = map[string]any{"type": "list(string)"}
		boot := map[string]any{
			"triggers_replace": "${" + inst + ".id}",
			"input": map[string]any{
				"script": "${" + inst + ".output}",
				"root":   "${var." + rv + "[" + idx + "]}",
			},
			"provisioner": []any{
				map[string]any{"local-exec": map[string]any{"command": "${self.input.script}", "interpreter": []string{"/bin/bash", "-c"}}},
				map[string]any{"local-exec": map[string]any{"when": "destroy", "command": stopScript("${self.input.root}", true), "interpreter": []string{"/bin/bash", "-c"}}},
			},
		}
		if counted[name] {
			boot["count"] = len(roots[name])
		}
		res["kloud_boot_"+name] = boot
		s.b.Template.Variables[rv] = roots[name]
	}
	b, err := json.MarshalIndent(map[string]any{"variable": vars, "resource": map[string]any{"terraform_data": res}}, "", "  ")
	if err != nil {
		return nil, err
	}
	s.b.Template.Files["kloud_dummy.tf.json"] = b
	return s.b.Template, nil
}

// stopScript kills a machine's processes (its provisioning and its klient supervisor, each the
// leader of its own process group) and, for destroy, removes its directory.
func stopScript(root string, remove bool) string {
	s := `root="` + root + `"
for f in "$root/run/kloud/klient-supervisor.pid" "$root/run/kloud/provision.pid"; do
  pid=$(cat "$f" 2>/dev/null || true)
  if [ -n "$pid" ] && [ "$pid" -gt 1 ]; then kill -TERM -- "-$pid" 2>/dev/null || true; fi
done
sleep 0.2
for f in "$root/run/kloud/klient-supervisor.pid" "$root/run/kloud/provision.pid"; do
  pid=$(cat "$f" 2>/dev/null || true)
  if [ -n "$pid" ] && [ "$pid" -gt 1 ]; then kill -KILL -- "-$pid" 2>/dev/null || true; fi
done
`
	if remove {
		s += `case "$root" in /*/*) rm -rf -- "$root" ;; esac
`
	}
	return s
}

type machine struct {
	d *dummy
	b *provider.BaseMachine
}

func (m *machine) root() string { return m.d.root(m.b.StackID, m.b.Label) }

func (m *machine) supervisor() (int, bool) {
	b, err := os.ReadFile(filepath.Join(m.root(), userdata.SupervisorPIDPath))
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(string(trim(b)))
	if err != nil || pid <= 1 {
		return 0, false
	}
	return pid, syscall.Kill(pid, 0) == nil
}

func (m *machine) Info(ctx context.Context) (provider.State, any, error) {
	if err := m.d.fail("Info"); err != nil {
		return provider.Unknown, nil, err
	}
	if _, err := os.Stat(m.root()); err != nil {
		return provider.Terminated, nil, nil
	}
	if _, alive := m.supervisor(); alive {
		return provider.Running, nil, nil
	}
	return provider.Stopped, nil, nil
}

func (m *machine) Stop(ctx context.Context) (any, error) {
	if err := m.d.fail("Stop"); err != nil {
		return nil, err
	}
	pid, alive := m.supervisor()
	if !alive {
		return nil, nil
	}
	syscall.Kill(-pid, syscall.SIGTERM)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if syscall.Kill(pid, 0) != nil {
			return nil, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	syscall.Kill(-pid, syscall.SIGKILL)
	return nil, nil
}

func (m *machine) Start(ctx context.Context) (any, error) {
	if err := m.d.fail("Start"); err != nil {
		return nil, err
	}
	if _, alive := m.supervisor(); alive {
		return nil, nil
	}
	script := filepath.Join(m.root(), userdata.StartKlientPath)
	if _, err := os.Stat(script); err != nil {
		return nil, fmt.Errorf("dummy: machine %s was never provisioned: %w", m.b.Label, err)
	}
	out, err := execScript(ctx, script)
	if err != nil {
		return nil, fmt.Errorf("dummy: start %s: %w: %s", m.b.Label, err, out)
	}
	return nil, nil
}

// ConsoleLog implements provider.ConsoleLogger: the machine's cloud-init output.
func (m *machine) ConsoleLog(ctx context.Context) (string, error) {
	b, err := os.ReadFile(filepath.Join(m.root(), userdata.CloudInitOutputPath))
	return string(b), err
}

var (
	_ provider.ConsoleLogger = (*machine)(nil)
	_ provider.Machine       = (*machine)(nil)
	_ provider.Stack         = (*stack)(nil)
)

func trim(b []byte) []byte { return []byte(strings.TrimSpace(string(b))) }

func execScript(ctx context.Context, path string) ([]byte, error) {
	return exec.CommandContext(ctx, "/bin/bash", path).CombinedOutput()
}
