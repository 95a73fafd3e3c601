package vagrant

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	hcljson "github.com/hashicorp/hcl/v2/json"
	"github.com/zclconf/go-cty/cty"

	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/provider/tmpl"
	"github.com/kloud-dev/kloud/providers/vagrant/tfprovider"
	"github.com/kloud-dev/kloud/userdata"
)

// GeneratedFile holds the kloudvagrant provider's configuration and required_providers entry that
// ApplyTemplate writes. User files may not use the name.
const GeneratedFile = "kloud_vagrant.tf.json"

// Variables ApplyTemplate declares (in tmpl.GeneratedFile) for the tags of resource res.
func stackVar(res string) string   { return "kloud_vagrant_stack_" + res }
func machineVar(res string) string { return "kloud_vagrant_machine_" + res }

type stack struct {
	v *Vagrant
	b *provider.BaseStack
}

// VerifyCredential: the vagrant provider takes no credential (the owner's host klient is the
// credential); it checks that kloud can serve it.
func (s *stack) VerifyCredential(ctx context.Context, c *provider.Credential) error {
	return s.v.Available()
}

// BootstrapTemplates: nothing to bootstrap.
func (s *stack) BootstrapTemplates(ctx context.Context, c *provider.Credential) ([]*provider.Template, error) {
	return nil, nil
}

// ApplyTemplate rewrites the stack's template: every kloudvagrant_machine gets its agent's
// cloud-init and the kloud_stack and kloud_machine tags, and the template gets the kloudvagrant
// provider configured for this kloud's vagrant machine service (GeneratedFile): the endpoint, and
// a token for this stack (sensitive variable TokenVar) that may create exactly b.Machines.
//
// With no Machines (a destroy, or a refresh) it only configures the provider: the token may then
// read, retag and destroy the stack's machines but create none, and no agent key is minted.
func (s *stack) ApplyTemplate(ctx context.Context, c *provider.Credential) (*provider.Template, error) {
	if err := s.v.Available(); err != nil {
		return nil, fmt.Errorf("vagrant machines cannot be built: %w", err)
	}
	if s.v.opts.Endpoint == "" {
		return nil, errors.New("vagrant provider: no endpoint of kloud's vagrant machine service configured (vagrant.Options.Endpoint)")
	}
	b := s.b
	if _, taken := b.Template.Files[GeneratedFile]; taken {
		return nil, fmt.Errorf("template file %s: the name is reserved for kloud's generated provider configuration", GeneratedFile)
	}
	cfg, err := b.Template.Parsed()
	if err != nil {
		return nil, err
	}
	if len(b.Machines) == 0 && !slices.Contains(cfg.Providers(), tfprovider.Name) && len(cfg.Resources(ResourceType)) == 0 {
		return b.Template, nil // no vagrant machines in this stack
	}
	for _, v := range cfg.Variables() {
		if v.Name == TokenVar && v.File != tmpl.GeneratedFile {
			return nil, fmt.Errorf("%s:%d: variable %q: the name is reserved for kloud's token of the vagrant machine service", v.File, v.Line, TokenVar)
		}
	}
	if len(b.Machines) > 0 {
		// Fail before terraform when the owner has no vagrant host connected.
		if _, err := s.v.hosts.Host(ctx, b.Owner, ""); err != nil {
			return nil, err
		}
	}

	err = b.InjectUserData(ctx, func(m *provider.MachineSpec, ac userdata.Config) ([]byte, error) {
		// The machine's hostname is the resource's hostname attribute, which the sandbox gives
		// cloud-init as the NoCloud meta-data's local-hostname. Leaving it out of the user data
		// lets that win, also when the attribute is an expression kloud cannot evaluate.
		ac.Hostname = ""
		return userdata.Render(ac)
	})
	if err != nil {
		return nil, err
	}
	if err := s.setTags(); err != nil {
		return nil, err
	}
	if cfg, err = b.Template.Parsed(); err != nil {
		return nil, err
	}
	if err := cfg.DeclareVariable(TokenVar, "string", true); err != nil {
		return nil, err
	}
	files, err := configureProvider(cfg.Files(), s.v.opts.Endpoint)
	if err != nil {
		return nil, err
	}
	if cfg, err = tmpl.Parse(files); err != nil {
		return nil, fmt.Errorf("vagrant provider produced an invalid template (a bug): %w", err)
	}
	// The token reaches the generated provider block only: never a resource, output or log.
	if err := cfg.CheckSecretRefs([]string{TokenVar}); err != nil {
		return nil, fmt.Errorf("template: %w", err)
	}
	ids := make([]string, 0, len(b.Machines))
	for _, m := range b.Machines {
		ids = append(ids, m.ID)
	}
	token, err := s.v.Token(b.StackID, b.Owner, ids)
	if err != nil {
		return nil, fmt.Errorf("vagrant provider: token: %w", err)
	}
	if b.Template.Variables == nil {
		b.Template.Variables = map[string]any{}
	}
	b.Template.Variables[TokenVar] = token
	b.Template.Files, b.Template.Config = files, cfg
	return b.Template, nil
}

// setTags points tags.kloud_stack and tags.kloud_machine of every machine resource at generated
// variables holding the stack id and each count index's machine id. The user's other tags stay.
func (s *stack) setTags() error {
	b := s.b
	cfg, err := b.Template.Parsed()
	if err != nil {
		return err
	}
	byRes := map[string][]*provider.MachineSpec{}
	for _, m := range b.Machines {
		byRes[m.Resource] = append(byRes[m.Resource], m)
	}
	names := make([]string, 0, len(byRes))
	for n := range byRes {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, res := range names {
		ms := byRes[res]
		sort.Slice(ms, func(i, j int) bool { return idx(ms[i]) < idx(ms[j]) })
		stacks, machines := make([]string, len(ms)), make([]string, len(ms))
		for i, m := range ms {
			stacks[i], machines[i] = b.StackID, m.ID
		}
		counted := ms[0].Index != nil
		typ := "string"
		if counted {
			typ = "list(string)"
		}
		for _, t := range []struct {
			tag, v string
			vals   []string
		}{{TagStack, stackVar(res), stacks}, {TagMachine, machineVar(res), machines}} {
			if err := cfg.SetUserData(ResourceType, res, "tags."+t.tag, t.v); err != nil {
				return fmt.Errorf("%s.%s: tags: %w (kloud adds its tags to a literal map { ... } only)", ResourceType, res, err)
			}
			if err := cfg.DeclareVariable(t.v, typ, false); err != nil {
				return err
			}
			if counted {
				b.Template.Variables[t.v] = t.vals
			} else {
				b.Template.Variables[t.v] = t.vals[0]
			}
		}
	}
	b.Template.Files = cfg.Files()
	return nil
}

func idx(m *provider.MachineSpec) int {
	if m.Index == nil {
		return -1
	}
	return *m.Index
}

// configureProvider removes the user's `provider "kloudvagrant"` block (which must be empty) and
// writes GeneratedFile with the provider configured for the service at endpoint, with the token
// from variable TokenVar, plus the required_providers entry unless the user declared it (with the
// right source).
func configureProvider(files map[string][]byte, endpoint string) (map[string][]byte, error) {
	out := make(map[string][]byte, len(files)+1)
	declared := false
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		src := files[name]
		out[name] = src
		if name == tmpl.GeneratedFile {
			continue
		}
		isJSON := strings.HasSuffix(name, ".tf.json")
		var f *hcl.File
		var diags hcl.Diagnostics
		if isJSON {
			f, diags = hcljson.Parse(src, name)
		} else {
			f, diags = hclsyntax.ParseConfig(src, name, hcl.InitialPos)
		}
		if diags.HasErrors() {
			return nil, diags
		}
		content, _, diags := f.Body.PartialContent(&hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{
			{Type: "provider", LabelNames: []string{"name"}}, {Type: "terraform"},
		}})
		if diags.HasErrors() {
			return nil, diags
		}
		var remove []hcl.Range
		for _, blk := range content.Blocks {
			switch blk.Type {
			case "terraform":
				ok, err := requiresKloudvagrant(blk)
				if err != nil {
					return nil, err
				}
				declared = declared || ok
			case "provider":
				if blk.Labels[0] != tfprovider.Name {
					continue
				}
				if err := checkProviderBlock(blk); err != nil {
					return nil, err
				}
				remove = append(remove, blk.DefRange)
			}
		}
		if len(remove) == 0 {
			continue
		}
		var err error
		if isJSON {
			out[name], err = removeJSONProvider(src)
		} else {
			out[name], err = removeHCLBlocks(f, src, remove)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: remove provider %q: %w", name, tfprovider.Name, err)
		}
	}

	gen := map[string]any{
		"//": "Generated by kloud (vagrant provider): the kloudvagrant provider works on the machines kloud manages. Do not edit.",
		"provider": map[string]any{tfprovider.Name: map[string]string{
			"endpoint": escape(endpoint),
			"token":    "${var." + TokenVar + "}",
		}},
	}
	if !declared {
		gen["terraform"] = map[string]any{"required_providers": map[string]any{
			tfprovider.Name: map[string]string{"source": tfprovider.Source, "version": tfprovider.Version},
		}}
	}
	b, err := marshalJSON(gen)
	if err != nil {
		return nil, err
	}
	out[GeneratedFile] = b
	return out, nil
}

// requiresKloudvagrant reports whether a terraform block declares kloudvagrant in
// required_providers; declared with another source, it is an error.
func requiresKloudvagrant(blk *hcl.Block) (bool, error) {
	content, _, diags := blk.Body.PartialContent(&hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{{Type: "required_providers"}}})
	if diags.HasErrors() {
		return false, diags
	}
	found := false
	for _, rp := range content.Blocks {
		attrs, diags := rp.Body.JustAttributes()
		if diags.HasErrors() {
			return false, diags
		}
		a, ok := attrs[tfprovider.Name]
		if !ok {
			continue
		}
		v, diags := a.Expr.Value(nil)
		src := ""
		if !diags.HasErrors() && v.IsWhollyKnown() && !v.IsNull() && v.Type().IsObjectType() && v.Type().HasAttribute("source") {
			if s := v.GetAttr("source"); s.Type() == cty.String && !s.IsNull() {
				src = s.AsString()
			}
		}
		if strings.TrimPrefix(src, "registry.terraform.io/") != tfprovider.Source {
			return false, fmt.Errorf("%s: required_providers.%s must have source = %q (found %q); or leave it out and kloud declares it",
				a.Range, tfprovider.Name, tfprovider.Source, src)
		}
		found = true
	}
	return found, nil
}

// checkProviderBlock accepts an empty provider "kloudvagrant" block: kloud configures the provider.
func checkProviderBlock(blk *hcl.Block) error {
	attrs, diags := blk.Body.JustAttributes()
	if diags.HasErrors() {
		return fmt.Errorf("%s: provider %q: %w", blk.DefRange, tfprovider.Name, diags)
	}
	if len(attrs) == 0 {
		return nil
	}
	n := slices.Sorted(maps.Keys(attrs))[0]
	return fmt.Errorf("%s: provider %q: kloud configures this provider itself; remove %s (an empty block, or none, is fine)", attrs[n].Range, tfprovider.Name, n)
}

// removeHCLBlocks replaces the blocks whose definition ranges are given with a comment, keeping
// the file's line count so Terraform's messages still point at the right lines.
func removeHCLBlocks(f *hcl.File, src []byte, defs []hcl.Range) ([]byte, error) {
	body, ok := f.Body.(*hclsyntax.Body)
	if !ok {
		return nil, fmt.Errorf("unexpected body type %T", f.Body)
	}
	var ranges []hcl.Range
	for _, blk := range body.Blocks {
		for _, d := range defs {
			if blk.DefRange() == d {
				ranges = append(ranges, blk.Range())
			}
		}
	}
	if len(ranges) != len(defs) {
		return nil, fmt.Errorf("found %d of %d blocks", len(ranges), len(defs))
	}
	sort.Slice(ranges, func(i, j int) bool { return ranges[i].Start.Byte > ranges[j].Start.Byte })
	out := bytes.Clone(src)
	for _, r := range ranges {
		old := out[r.Start.Byte:r.End.Byte]
		text := fmt.Sprintf("# provider %q: configured by kloud in %s", tfprovider.Name, GeneratedFile) + strings.Repeat("\n", bytes.Count(old, []byte{'\n'}))
		out = append(out[:r.Start.Byte:r.Start.Byte], append([]byte(text), out[r.End.Byte:]...)...)
	}
	return out, nil
}

// removeJSONProvider deletes provider.kloudvagrant from a .tf.json file (the object or the array
// form of "provider"). The file is re-encoded; every other value keeps its bytes' meaning.
func removeJSONProvider(src []byte) ([]byte, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(src, &top); err != nil {
		return nil, err
	}
	raw := bytes.TrimSpace(top["provider"])
	drop := func(obj json.RawMessage) (map[string]json.RawMessage, error) {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(obj, &m); err != nil {
			return nil, err
		}
		delete(m, tfprovider.Name)
		return m, nil
	}
	var newProv any
	if len(raw) > 0 && raw[0] == '[' {
		var arr []json.RawMessage
		if err := json.Unmarshal(raw, &arr); err != nil {
			return nil, err
		}
		var kept []map[string]json.RawMessage
		for _, el := range arr {
			m, err := drop(el)
			if err != nil {
				return nil, err
			}
			if len(m) > 0 {
				kept = append(kept, m)
			}
		}
		if len(kept) > 0 {
			newProv = kept
		}
	} else {
		m, err := drop(raw)
		if err != nil {
			return nil, err
		}
		if len(m) > 0 {
			newProv = m
		}
	}
	if newProv == nil {
		delete(top, "provider")
	} else {
		b, err := json.Marshal(newProv)
		if err != nil {
			return nil, err
		}
		top["provider"] = b
	}
	return marshalJSON(top)
}

func marshalJSON(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// escape escapes HCL template sequences, so a value reaches the provider literally from a
// .tf.json string.
func escape(v string) string {
	return strings.NewReplacer("${", "$${", "%{", "%%{").Replace(v)
}
