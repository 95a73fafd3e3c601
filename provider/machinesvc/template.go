package machinesvc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/provider/tmpl"
	"github.com/kloud-dev/kloud/userdata"
)

// Template is how a provider whose machines a machine service makes rewrites a stack's template
// (its Stack.ApplyTemplate calls Apply): every machine resource gets its agent's cloud-init and
// the stack and machine tags, and the template gets the Terraform provider configured for this
// kloud's machine service (Provider.File): the endpoint, and a token for this stack (sensitive
// variable TokenVar) that may create exactly the stack's planned machines.
type Template struct {
	// Kind names the provider in messages ("local provider", "kloud's local machine service",
	// "local.Options.Endpoint") and in the generated variables (kloud_<Kind>_stack_<resource>).
	Kind string
	// Provider is the Terraform provider: Name, Source, Version, File and Comment. Apply sets
	// its Args (endpoint and token).
	Provider tmpl.ProviderConfig
	// ResourceType is the machine resource ("kloudlocal_machine").
	ResourceType string
	// TokenVar is the sensitive variable holding the stack's token ("kloud_local_token").
	TokenVar string
	// TagStack and TagMachine are the tag keys of the stack id and the kloud machine id.
	TagStack, TagMachine string
	// TagTeam and TagOwner, if set, are the tag keys of the stack's team and owner (kloud's
	// tags, provider.TagTeam and TagOwner, as the provider stores them); SetTags sets them when
	// the stack has a team and an owner.
	TagTeam, TagOwner string
	// Endpoint is kloud's URL as the Terraform provider reaches it ("" refuses every build).
	Endpoint string

	// Check says why machines cannot be built (nil: they can); Apply returns its error as it is.
	Check func() error
	// Prepare runs before the user data is injected, when the stack has machines to create
	// (build the image, find the owner's host); Apply returns its error as it is. nil: nothing.
	Prepare func(ctx context.Context, b *provider.BaseStack) error
	// Token mints the stack build's token that may create the kloud machine ids given.
	Token func(b *provider.BaseStack, machines []string) (string, error)
}

// Apply rewrites b.Template (see Template) and returns it.
//
// With no Machines (a destroy, or a refresh) it only configures the provider: the token may then
// read, retag and destroy the stack's machines but create none, and no agent key is minted. A
// template without the provider and its machines is returned as it is.
func (t *Template) Apply(ctx context.Context, b *provider.BaseStack) (*provider.Template, error) {
	if err := t.Check(); err != nil {
		return nil, err
	}
	if t.Endpoint == "" {
		return nil, fmt.Errorf("%s provider: no endpoint of kloud's %s machine service configured (%s.Options.Endpoint)", t.Kind, t.Kind, t.Kind)
	}
	if _, taken := b.Template.Files[t.Provider.File]; taken {
		return nil, t.reservedFile()
	}
	cfg, err := b.Template.Parsed()
	if err != nil {
		return nil, err
	}
	if len(b.Machines) == 0 && !b.Vacating && !slices.Contains(cfg.Providers(), t.Provider.Name) && len(cfg.Resources(t.ResourceType)) == 0 {
		return b.Template, nil // no machines of this provider in this stack
	}
	// The rules kloud checked at save and plan (Validate), again: the same messages at build.
	if fs, err := t.Validate(b.Template.Files); err != nil || len(fs) > 0 {
		return nil, errors.Join(err, provider.JoinFindings(fs))
	}
	if len(b.Machines) > 0 && t.Prepare != nil {
		if err := t.Prepare(ctx, b); err != nil {
			return nil, err
		}
	}

	err = b.InjectUserData(ctx, func(m *provider.MachineSpec, ac userdata.Config) ([]byte, error) {
		// The machine's hostname is the resource's hostname attribute, which the machine
		// gives cloud-init as the NoCloud meta-data's local-hostname. Leaving it out of the
		// user data lets that win, also when the attribute is an expression kloud cannot
		// evaluate.
		ac.Hostname = ""
		return userdata.Render(ac)
	})
	if err != nil {
		return nil, err
	}
	if err := t.SetTags(b); err != nil {
		return nil, err
	}
	if cfg, err = b.Template.Parsed(); err != nil {
		return nil, err
	}
	if err := cfg.DeclareVariable(t.TokenVar, "string", true); err != nil {
		return nil, err
	}
	files, err := t.Configure(cfg.Files())
	if err != nil {
		return nil, err
	}
	if cfg, err = tmpl.Parse(files); err != nil {
		return nil, fmt.Errorf("%s provider produced an invalid template (a bug): %w", t.Kind, err)
	}
	// The token reaches the generated provider block only: never a resource, output or log.
	if err := cfg.CheckSecretRefs([]string{t.TokenVar}); err != nil {
		return nil, fmt.Errorf("template: %w", err)
	}
	ids := make([]string, 0, len(b.Machines))
	for _, m := range b.Machines {
		ids = append(ids, m.ID)
	}
	if t.Token == nil {
		return nil, errors.New("machinesvc: Template.Token is not set (a bug)")
	}
	token, err := t.Token(b, ids)
	if err != nil {
		return nil, fmt.Errorf("%s provider: token: %w", t.Kind, err)
	}
	if b.Template.Variables == nil {
		b.Template.Variables = map[string]any{}
	}
	b.Template.Variables[t.TokenVar] = token
	b.Template.Files, b.Template.Config = files, cfg
	return b.Template, nil
}

// Rules of a machine service provider's templates (provider.TemplateFinding's Rule).
const (
	// RuleReserved: a name kloud generates (Provider.File, variables kloud_<Kind>_*).
	RuleReserved = "reserved-name"
	// RuleTags: a machine resource's tags that are not a literal map, to which kloud cannot add
	// its own.
	RuleTags = "literal-tags"
)

// Validate lists what t refuses in a template's (user's) files, naming file and line: a file
// named Provider.File, variables named kloud_<Kind>_* (TokenVar and the tags' variables), and
// a machine resource whose tags are not a literal map { ... } (SetTags adds kloud's tags to
// it). A template without the provider's resources and without its Terraform provider has
// none. The error is a syntax error. A provider's Stack.ValidateTemplate returns it
// (provider.TemplateValidator), and Apply checks it again.
func (t *Template) Validate(files map[string][]byte) ([]provider.TemplateFinding, error) {
	cfg, err := tmpl.Parse(files)
	if err != nil {
		return nil, err
	}
	if !slices.Contains(cfg.Providers(), t.Provider.Name) && len(cfg.Resources(t.ResourceType)) == 0 {
		return nil, nil
	}
	var out []provider.TemplateFinding
	if _, taken := files[t.Provider.File]; taken {
		out = append(out, t.reservedFile())
	}
	prefix := "kloud_" + t.Kind + "_"
	for _, v := range cfg.Variables() {
		if strings.HasPrefix(v.Name, prefix) && v.File != tmpl.GeneratedFile {
			out = append(out, provider.TemplateFinding{File: v.File, Line: v.Line, Construct: fmt.Sprintf("variable %q", v.Name), Rule: RuleReserved,
				Detail: fmt.Sprintf("names starting with %s are reserved for the variables kloud generates (%s holds the stack's token for kloud's %s machine service); rename it", prefix, t.TokenVar, t.Kind)})
		}
	}
	for _, r := range cfg.Resources(t.ResourceType) {
		if strings.HasPrefix(r.Name, "kloud_") {
			continue // kloud's own resources (kloud.machineResources)
		}
		// On a parse of its own: SetUserData rewrites the files it is given.
		c, err := tmpl.Parse(files)
		if err != nil {
			return nil, err
		}
		if err := c.SetUserData(t.ResourceType, r.Name, "tags."+t.TagStack, t.StackVar(r.Name)); err != nil {
			out = append(out, provider.TemplateFinding{File: r.File, Line: r.Line, Construct: t.ResourceType + "." + r.Name + ": tags", Rule: RuleTags,
				Detail: fmt.Sprintf("kloud adds its own tags (%s, %s, ...) to the machine's tags, which must be a literal map { key = value, ... } for that (%s)", t.TagStack, t.TagMachine, err.Error())})
		}
	}
	return out, nil
}

// reservedFile refuses a template file named Provider.File.
func (t *Template) reservedFile() provider.TemplateFinding {
	return provider.TemplateFinding{File: t.Provider.File, Line: 1, Construct: "file name " + t.Provider.File, Rule: RuleReserved,
		Detail: fmt.Sprintf("the name is reserved for the %s provider configuration kloud generates; rename the file", t.Provider.Name)}
}

// Configure removes the user's provider block (which must be empty) and writes Provider.File
// with the provider configured for the service at Endpoint, with the token from variable
// TokenVar (tmpl.ConfigureProvider).
func (t *Template) Configure(files map[string][]byte) (map[string][]byte, error) {
	p := t.Provider
	p.Args = map[string]string{
		"endpoint": tmpl.EscapeTemplate(t.Endpoint),
		"token":    "${var." + t.TokenVar + "}",
	}
	return tmpl.ConfigureProvider(files, p)
}

// StackVar and MachineVar are the variables SetTags declares (in tmpl.GeneratedFile) for the
// tags of resource res.
func (t *Template) StackVar(res string) string   { return "kloud_" + t.Kind + "_stack_" + res }
func (t *Template) MachineVar(res string) string { return "kloud_" + t.Kind + "_machine_" + res }

// TeamVar and OwnerVar are the variables SetTags declares for tags TagTeam and TagOwner.
func (t *Template) TeamVar(res string) string  { return "kloud_" + t.Kind + "_team_" + res }
func (t *Template) OwnerVar(res string) string { return "kloud_" + t.Kind + "_owner_" + res }

// SetTags points tags.<TagStack> and tags.<TagMachine> (and tags.<TagTeam> and tags.<TagOwner>
// if set) of every machine resource at generated variables holding the stack id, each count
// index's machine id, and the stack's team and owner. The user's other tags stay.
func (t *Template) SetTags(b *provider.BaseStack) error {
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
		teams, owners := make([]string, len(ms)), make([]string, len(ms))
		for i, m := range ms {
			stacks[i], machines[i] = b.StackID, m.ID
			teams[i], owners[i] = b.Team, b.Owner
		}
		counted := ms[0].Index != nil
		typ := "string"
		if counted {
			typ = "list(string)"
		}
		type tagVar struct {
			tag, v string
			vals   []string
		}
		tags := []tagVar{{t.TagStack, t.StackVar(res), stacks}, {t.TagMachine, t.MachineVar(res), machines}}
		if t.TagTeam != "" && b.Team != "" {
			tags = append(tags, tagVar{t.TagTeam, t.TeamVar(res), teams})
		}
		if t.TagOwner != "" && b.Owner != "" {
			tags = append(tags, tagVar{t.TagOwner, t.OwnerVar(res), owners})
		}
		for _, tv := range tags {
			if err := cfg.SetUserData(t.ResourceType, res, "tags."+tv.tag, tv.v); err != nil {
				return fmt.Errorf("%s.%s: tags: %w (kloud adds its tags to a literal map { ... } only)", t.ResourceType, res, err)
			}
			if err := cfg.DeclareVariable(tv.v, typ, false); err != nil {
				return err
			}
			if counted {
				b.Template.Variables[tv.v] = tv.vals
			} else {
				b.Template.Variables[tv.v] = tv.vals[0]
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
