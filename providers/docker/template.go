package docker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	hcljson "github.com/hashicorp/hcl/v2/json"

	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/provider/tmpl"
	"github.com/kloud-dev/kloud/userdata"
)

// GeneratedFile holds the docker provider's configuration and required_providers entry that
// ApplyTemplate writes. User files may not use the name.
const GeneratedFile = "kloud_docker.tf.json"

// allowedArgs are the docker_container arguments and nested blocks a template may set: the
// machine's size, its environment inside the container, and Terraform's meta-arguments. Every
// other argument is refused, with the file and line: those that reach the host (privileged,
// volumes, mounts, devices, capabilities, pid/ipc/userns/cgroupns modes, network_mode,
// security_opts, sysctls, runtime, gpus, ports, log options, ...) and those kloud sets itself
// (image, name, entrypoint, command, network, labels, upload, init, start, user, ...).
var allowedArgs = map[string]bool{
	"hostname": true, "domainname": true, "memory": true, "memory_swap": true, "cpus": true,
	"cpu_shares": true, "cpu_set": true, "env": true, "working_dir": true, "restart": true,
	"max_retry_count": true, "must_run": true, "stop_signal": true, "stop_timeout": true,
	"destroy_grace_seconds": true, "shm_size": true, "tmpfs": true, "dns": true, "dns_opts": true,
	"dns_search": true, "remove_volumes": true,
	// kloud replaces these two with its own values; a template must still write them (the
	// resource requires them), so any value is accepted.
	"name": true, "image": true,
	// Terraform's meta-arguments (for_each and provider are not: kloud's machines use count).
	"count": true, "depends_on": true, "lifecycle": true,
}

// argHints say, for a refused argument a user often means, what to do instead.
var argHints = map[string]string{
	"ports":             " (to reach a machine's port from your computer, use `kloud port-forward` or the machine's web app link; to let other machines in, `kloud machine ports open`)",
	"publish_all_ports": " (to reach a machine's port from your computer, use `kloud port-forward` or the machine's web app link; to let other machines in, `kloud machine ports open`)",
	"command":           " (a machine's own start-up script goes in a labels block with label = \"" + UserDataLabel + "\")",
	"entrypoint":        " (a machine's own start-up script goes in a labels block with label = \"" + UserDataLabel + "\")",
}

// Variables ApplyTemplate declares (in tmpl.GeneratedFile) for resource res.
func genVar(kind, res string) string { return "kloud_docker_" + kind + "_" + res }

type stack struct {
	d *Docker
	b *provider.BaseStack
}

// VerifyCredential: the docker provider takes no credential; it checks that the daemon answers.
func (s *stack) VerifyCredential(ctx context.Context, c *provider.Credential) error {
	return s.d.Available()
}

// BootstrapTemplates: nothing to bootstrap.
func (s *stack) BootstrapTemplates(ctx context.Context, c *provider.Credential) ([]*provider.Template, error) {
	return nil, nil
}

// ApplyTemplate checks the stack's docker_container resources against allowedArgs and rewrites
// them into kloud's machines: kloud's image, a container name of its own, the NoCloud seed and
// the boot script uploaded into the container, kloud's network, and the labels kloud_stack,
// kloud_machine, kloud_owner and kloud_instance. It writes the docker provider's configuration
// (GeneratedFile): host = the Docker API proxy for this stack, from the sensitive variable
// TokenVar.
//
// With no Machines (a destroy, or a refresh) it only configures the provider; the token then
// reads, stops and removes the stack's containers but creates none.
func (s *stack) ApplyTemplate(ctx context.Context, c *provider.Credential) (*provider.Template, error) {
	b := s.b
	if _, taken := b.Template.Files[GeneratedFile]; taken {
		return nil, reservedFile
	}
	cfg, err := b.Template.Parsed()
	if err != nil {
		return nil, err
	}
	if len(b.Machines) == 0 && !b.Vacating && !slices.Contains(cfg.Providers(), TerraformName) && len(cfg.Resources(ResourceType)) == 0 {
		return b.Template, nil // no docker machines in this stack
	}
	// The rules kloud already checked at save and plan (ValidateTemplate), again: the same
	// messages at build.
	if err := findingsErr(Findings(b.Template.Files)); err != nil {
		return nil, err
	}
	for _, m := range b.Machines {
		if err := checkPlanned(m); err != nil {
			return nil, err
		}
	}
	// The template's own user data (UserDataLabel, userscript.go): read per machine, then the
	// labels blocks go (kloud writes the container's labels).
	scripts := map[string]string{}
	for res, ms := range byResource(b.Machines) {
		for i, sc := range userScripts(cfg, res, ms) {
			scripts[ms[i].ID] = sc
		}
	}
	if b.Template.Files, err = stripUserData(b.Template.Files); err != nil {
		return nil, err
	}
	if cfg, err = b.Template.Parsed(); err != nil {
		return nil, err
	}
	if s.d.opts.Endpoint == "" {
		return nil, errors.New("docker provider: no endpoint of kloud's Docker API proxy configured (docker.Options.Endpoint)")
	}
	if err := s.d.Available(); err != nil {
		return nil, err
	}
	if b.Template.Variables == nil {
		b.Template.Variables = map[string]any{}
	}
	if len(b.Machines) > 0 {
		image, err := s.d.ensureImage(ctx)
		if err != nil {
			return nil, err
		}
		if err := s.d.EnsureNetwork(ctx); err != nil {
			return nil, err
		}
		if err := s.rewriteMachines(ctx, cfg, image, scripts); err != nil {
			return nil, err
		}
		if cfg, err = b.Template.Parsed(); err != nil {
			return nil, err
		}
	}
	if err := cfg.DeclareVariable(TokenVar, "string", true); err != nil {
		return nil, err
	}
	files, err := configureProvider(cfg.Files())
	if err != nil {
		return nil, err
	}
	if cfg, err = tmpl.Parse(files); err != nil {
		return nil, fmt.Errorf("docker provider produced an invalid template (a bug): %w", err)
	}
	if err := cfg.CheckSecretRefs([]string{TokenVar}); err != nil {
		return nil, fmt.Errorf("template: %w", err)
	}
	tok, err := s.d.stackToken(b) // token.go
	if err != nil {
		return nil, fmt.Errorf("docker provider: token: %w", err)
	}
	b.Template.Variables[TokenVar] = "tcp://" + strings.TrimPrefix(strings.TrimPrefix(strings.TrimSuffix(s.d.opts.Endpoint, "/"), "http://"), "tcp://") +
		provider.HandlerPrefix(Name) + "v1/" + tok
	b.Template.Files, b.Template.Config = files, cfg
	return b.Template, nil
}

// rewriteMachines gives every docker_container of b.Machines kloud's settings (see ApplyTemplate).
// scripts holds each machine's user data (by machine id).
func (s *stack) rewriteMachines(ctx context.Context, cfg *tmpl.Config, image string, scripts map[string]string) error {
	b := s.b
	swapLimit := sync.OnceValue(func() bool { return s.d.swapLimit(ctx) }) // asked only for a template with memory
	byRes := byResource(b.Machines)
	for _, res := range slices.Sorted(maps.Keys(byRes)) {
		ms := byRes[res]
		counted := ms[0].Index != nil
		if !counted && len(ms) != 1 {
			return fmt.Errorf("%s.%s: %d machines without count", ResourceType, res, len(ms))
		}
		lit := cfg.LiteralAttrs(ResourceType, res)
		args := resourceArgs(cfg, res)
		userHostname := slices.Contains(args, "hostname") // a literal or an expression: the user's
		// cpus and memory_swap as the Docker provider reads them back (drift.go).
		limits, err := limitVars(res, lit, args, ms, swapLimit)
		if err != nil {
			return err
		}
		vals := map[string][]any{}
		add := func(kind string, v any) { vals[kind] = append(vals[kind], v) }
		for i, m := range ms {
			if counted && index(m) != i {
				return fmt.Errorf("%s.%s: machines must have count indexes 0..%d, got %d", ResourceType, res, len(ms)-1, index(m))
			}
			host := provider.Hostname(m.Label)
			if h, ok := lit["hostname"].(string); ok && h != "" {
				host = h
			}
			ac, err := b.AgentConfig(ctx, m)
			if err != nil {
				return fmt.Errorf("machine %s: %w", m.Label, err)
			}
			ac.Hostname = ""
			ac.UserData = scripts[m.ID]
			ud, err := userdata.Render(ac)
			if err != nil {
				return fmt.Errorf("machine %s: user data: %w", m.Label, err)
			}
			meta := "instance-id: " + strconv.Quote(m.ID) + "\n"
			if !userHostname {
				meta += "local-hostname: " + strconv.Quote(host) + "\n"
			}
			add("image", image)
			add("name", "kloud-"+m.ID)
			add("hostname", host)
			add("entrypoint", []string{BootPath})
			add("network", s.d.opts.Network)
			add("user_data", string(ud))
			add("meta_data", meta)
			add("boot", bootScript)
			add("stack", b.StackID)
			add("machine", m.ID)
			add("owner", m.Owner)
			add("team", b.Team) // resources.go
			add("instance", s.d.instance)
		}
		maps.Copy(vals, limits)
		sensitive := map[string]bool{"user_data": true}
		listType := map[string]string{"entrypoint": "list(string)", "memory_swap": "number"}
		for _, kind := range slices.Sorted(maps.Keys(vals)) {
			if kind == "hostname" && userHostname {
				continue
			}
			v := genVar(kind, res)
			typ := listType[kind]
			if typ == "" {
				typ = "string"
			}
			if counted {
				typ = "list(" + typ + ")"
				b.Template.Variables[v] = vals[kind]
			} else {
				b.Template.Variables[v] = vals[kind][0]
			}
			if err := cfg.DeclareVariable(v, typ, sensitive[kind]); err != nil {
				return err
			}
		}
		ref := func(kind string) string {
			if counted {
				return "var." + genVar(kind, res) + "[count.index]"
			}
			return "var." + genVar(kind, res)
		}
		set := map[string]string{"image": "image", "name": "name", "entrypoint": "entrypoint", "network_mode": "network"}
		if !userHostname {
			set["hostname"] = "hostname"
		}
		for kind := range limits {
			set[kind] = kind
		}
		for _, attr := range slices.Sorted(maps.Keys(set)) {
			if err := cfg.SetUserData(ResourceType, res, attr, genVar(set[attr], res)); err != nil {
				return fmt.Errorf("%s.%s: %w", ResourceType, res, err)
			}
		}
		var labels []map[string]string
		for _, l := range []struct{ label, kind string }{{LabelStack, "stack"}, {LabelMachine, "machine"}, {LabelOwner, "owner"}, {LabelTeam, "team"}, {LabelInstance, "instance"}} {
			labels = append(labels, map[string]string{"label": strconv.Quote(l.label), "value": ref(l.kind)})
		}
		if err := cfg.AddBlocks(ResourceType, res, "labels", labels); err != nil {
			return err
		}
		uploads := []map[string]string{
			{"file": strconv.Quote(BootPath), "content": ref("boot"), "executable": "true"},
			{"file": strconv.Quote("/var/lib/cloud/seed/nocloud/meta-data"), "content": ref("meta_data"), "permissions": `"0600"`},
			{"file": strconv.Quote("/var/lib/cloud/seed/nocloud/user-data"), "content": ref("user_data"), "permissions": `"0600"`},
		}
		if err := cfg.AddBlocks(ResourceType, res, "upload", uploads); err != nil {
			return err
		}
	}
	b.Template.Files = cfg.Files()
	return nil
}

// resourceArgs lists the arguments (and blocks) of resource docker_container.res.
func resourceArgs(cfg *tmpl.Config, res string) []string {
	for _, r := range cfg.Resources(ResourceType) {
		if r.Name == res {
			args, _ := userArgs(cfg.Files(), r.File, res)
			return args
		}
	}
	return nil
}

// byResource groups machines by resource, each group sorted by count index.
func byResource(machines []*provider.MachineSpec) map[string][]*provider.MachineSpec {
	byRes := map[string][]*provider.MachineSpec{}
	for _, m := range machines {
		byRes[m.Resource] = append(byRes[m.Resource], m)
	}
	for _, ms := range byRes {
		sort.Slice(ms, func(i, j int) bool { return index(ms[i]) < index(ms[j]) })
	}
	return byRes
}

func index(m *provider.MachineSpec) int {
	if m.Index == nil {
		return -1
	}
	return *m.Index
}

// The docker provider's template rules (provider.TemplateFinding's Rule).
const (
	// RuleArgument: a docker_container argument or nested block outside allowedArgs (labels:
	// but the one user data label).
	RuleArgument = "docker-argument"
	// RuleReserved: a name kloud's docker provider generates (GeneratedFile, variables
	// kloud_docker_*).
	RuleReserved = "reserved-name"
)

// ValidateTemplate is provider.TemplateValidator: the rules of Findings, which kloud checks
// at template.create and template.update, stack.plan and stack.create, stack.apply and the build
// (and logs before a destroy).
func (s *stack) ValidateTemplate(ctx context.Context, files map[string][]byte) ([]provider.TemplateFinding, error) {
	return Findings(files)
}

var _ provider.TemplateValidator = (*stack)(nil)

// Findings lists what the docker provider refuses in a template's (user's) files, naming file
// and line: docker_container arguments outside allowedArgs (CheckTemplate), a file named
// GeneratedFile, and variables named kloud_docker_*. A template without docker_container
// resources and without the docker Terraform provider has none. The error is a syntax error.
func Findings(files map[string][]byte) ([]provider.TemplateFinding, error) {
	cfg, err := tmpl.Parse(files)
	if err != nil {
		return nil, err
	}
	if !slices.Contains(cfg.Providers(), TerraformName) && len(cfg.Resources(ResourceType)) == 0 {
		return nil, nil
	}
	var out []provider.TemplateFinding
	if _, taken := files[GeneratedFile]; taken {
		out = append(out, reservedFile)
	}
	args, err := argFindings(files)
	if err != nil {
		return nil, err
	}
	out = append(out, args...)
	for _, v := range cfg.Variables() {
		if strings.HasPrefix(v.Name, "kloud_docker_") && v.File != tmpl.GeneratedFile {
			out = append(out, provider.TemplateFinding{File: v.File, Line: v.Line, Construct: fmt.Sprintf("variable %q", v.Name), Rule: RuleReserved,
				Detail: "names starting with kloud_docker_ are reserved for the variables kloud generates; rename it"})
		}
	}
	return out, nil
}

// reservedFile refuses a template file named GeneratedFile.
var reservedFile = provider.TemplateFinding{File: GeneratedFile, Line: 1, Construct: "file name " + GeneratedFile, Rule: RuleReserved,
	Detail: "the name is reserved for the docker provider configuration kloud generates; rename the file"}

// CheckTemplate refuses every docker_container argument or nested block outside allowedArgs
// (dynamic blocks included), in the user's files, naming file and line: the findings of rule
// RuleArgument, joined.
func CheckTemplate(files map[string][]byte) error {
	return findingsErr(argFindings(files))
}

// findingsErr joins findings into one error (nil without any), or returns err.
func findingsErr(fs []provider.TemplateFinding, err error) error {
	if err != nil {
		return err
	}
	return provider.JoinFindings(fs)
}

// argFindings are CheckTemplate's findings.
func argFindings(files map[string][]byte) ([]provider.TemplateFinding, error) {
	var out []provider.TemplateFinding
	allowed := strings.Join(slices.Sorted(maps.Keys(allowedArgs)), ", ")
	for _, name := range slices.Sorted(maps.Keys(files)) {
		if name == tmpl.GeneratedFile || name == GeneratedFile {
			continue
		}
		f, diags := parseFile(name, files[name])
		if diags.HasErrors() {
			return nil, diags
		}
		content, _, _ := f.Body.PartialContent(&hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{{Type: "resource", LabelNames: []string{"type", "name"}}}})
		for _, blk := range content.Blocks {
			if blk.Labels[0] != ResourceType {
				continue
			}
			userData, err := userDataBlocks(blk.Body, blk.Labels[1])
			if err != nil {
				var f provider.TemplateFinding
				if !errors.As(err, &f) {
					return nil, err
				}
				out = append(out, f)
			}
			for _, a := range bodyArgs(blk.Body) {
				if userData[a.rng] || (err != nil && a.name == "labels") {
					continue
				}
				if !allowedArgs[a.name] {
					out = append(out, provider.TemplateFinding{File: a.rng.Filename, Line: a.rng.Start.Line, Construct: ResourceType + "." + blk.Labels[1] + ": " + a.name, Rule: RuleArgument,
						Detail: "kloud's docker machines may set only " + allowed + "; kloud sets the image, name, network, entrypoint, labels and uploads itself, and nothing that reaches the host (privileged, volumes, mounts, devices, capabilities, host namespaces, security options, ports, ...) may be set" + argHints[a.name]})
				}
			}
		}
	}
	return out, nil
}

type arg struct {
	name string
	rng  hcl.Range
}

func parseFile(name string, src []byte) (*hcl.File, hcl.Diagnostics) {
	if strings.HasSuffix(name, ".tf.json") {
		return hcljson.Parse(src, name)
	}
	return hclsyntax.ParseConfig(src, name, hcl.InitialPos)
}

// bodyArgs lists a resource body's arguments and nested blocks ("dynamic" blocks by the type
// they generate). In JSON every property counts (attributes and blocks look alike there).
func bodyArgs(body hcl.Body) []arg {
	var out []arg
	if sb, ok := body.(*hclsyntax.Body); ok {
		for n, a := range sb.Attributes {
			out = append(out, arg{n, a.SrcRange})
		}
		for _, nb := range sb.Blocks {
			n := nb.Type
			if n == "dynamic" && len(nb.Labels) > 0 {
				n = nb.Labels[0]
			}
			out = append(out, arg{n, nb.TypeRange})
		}
	} else {
		attrs, _ := body.JustAttributes()
		for n, a := range attrs {
			if n == "dynamic" {
				// "dynamic": {"TYPE": {...}}: the generated block type counts.
				if m, diags := hcl.ExprMap(a.Expr); !diags.HasErrors() {
					for _, kv := range m {
						if k, d := kv.Key.Value(nil); !d.HasErrors() && k.Type().FriendlyName() == "string" {
							out = append(out, arg{k.AsString(), a.NameRange})
						}
					}
				}
				out = append(out, arg{"dynamic", a.NameRange})
				continue
			}
			out = append(out, arg{n, a.NameRange})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].rng.Start.Byte < out[j].rng.Start.Byte })
	return out
}

// userArgs returns the argument names of resource docker_container.res in file name.
func userArgs(files map[string][]byte, name, res string) ([]string, error) {
	f, diags := parseFile(name, files[name])
	if diags.HasErrors() {
		return nil, diags
	}
	content, _, _ := f.Body.PartialContent(&hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{{Type: "resource", LabelNames: []string{"type", "name"}}}})
	var out []string
	for _, blk := range content.Blocks {
		if blk.Labels[0] == ResourceType && blk.Labels[1] == res {
			for _, a := range bodyArgs(blk.Body) {
				out = append(out, a.name)
			}
		}
	}
	return out, nil
}

// checkPlanned refuses a machine whose planned attributes reach the host: a second look, at
// values, behind CheckTemplate's look at the arguments written (the proxy checks the real
// request a third time).
func checkPlanned(m *provider.MachineSpec) error {
	var bad []string
	for _, k := range []string{"privileged", "publish_all_ports", "read_only"} {
		if v, _ := m.Attributes[k].(bool); v {
			bad = append(bad, k)
		}
	}
	for _, k := range []string{"volumes", "mounts", "devices", "capabilities", "security_opts", "sysctls", "ports", "host", "group_add", "gpus", "runtime", "pid_mode", "ipc_mode", "userns_mode", "cgroupns_mode", "cgroup_parent", "networks_advanced", "user", "command", "log_opts", "storage_opts", "ulimit", "links"} {
		if !zero(m.Attributes[k]) {
			bad = append(bad, k)
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("machine %s: %s may not be set on kloud's docker machines", m.Label, strings.Join(bad, ", "))
	}
	return nil
}

// zero reports whether a planned value is unset: nil, "", false, 0, or an empty list or map
// (of any Go type: the store may hand back its own slice and map types).
func zero(v any) bool {
	if v == nil {
		return true
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Slice, reflect.Map, reflect.Array, reflect.String:
		return rv.Len() == 0
	case reflect.Pointer, reflect.Interface:
		return rv.IsNil() || zero(rv.Elem().Interface())
	}
	return rv.IsZero()
}
