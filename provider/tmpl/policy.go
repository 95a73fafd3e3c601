package tmpl

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	hcljson "github.com/hashicorp/hcl/v2/json"
	"github.com/zclconf/go-cty/cty"
)

// The template policy: templates are data, not code. Whoever may write a template may not
// administer the host that runs Terraform, so a template may use only what cannot reach that
// host. CheckPolicy is an allowlist: any construct it does not know is refused. Each refusal
// names a rule; a kloud administrator can lift rules for one trusted template revision
// (Policy.Lift). docs/template-policy.md explains every rule to users and admins.

// Policy rule ids.
const (
	// RuleBlock: a block type (top level or inside terraform) the policy does not allow:
	// import, ephemeral, action, provider_meta, unknown ones, top-level attributes.
	RuleBlock = "block"
	// RuleBackend: terraform { backend ... } and terraform { cloud ... }: state stored
	// elsewhere than kloud's terraformer, possibly at a host path.
	RuleBackend = "backend"
	// RuleModule: module blocks (code from outside the template).
	RuleModule = "module"
	// RuleProvider: providers kloud does not offer for stacks: their resources, data sources,
	// provider blocks, required_providers entries, provider meta-arguments and functions;
	// terraform_remote_state; provider blocks for providers kloud configures itself.
	RuleProvider = "provider"
	// RuleProvisioner: provisioner and connection blocks (commands run on the host or over SSH).
	RuleProvisioner = "provisioner"
	// RuleHostFunction: functions that read the host's files or reveal its paths (file,
	// templatefile, ...) and path.module, path.root, path.cwd.
	RuleHostFunction = "host-function"
	// RuleFunction: functions that are not on the policy's list of Terraform's built-ins.
	RuleFunction = "function"
)

// PolicyRules lists every rule id.
var PolicyRules = []string{RuleBackend, RuleBlock, RuleFunction, RuleHostFunction, RuleModule, RuleProvider, RuleProvisioner}

// Policy says what a template may use beyond Terraform's language.
type Policy struct {
	// Providers are the Terraform providers kloud offers for stacks (the built-in "terraform"
	// provider included, when offered: the dummy's terraform_data).
	Providers []AllowedProvider
	// Lift lists rule ids that are not enforced: a template an administrator trusted.
	Lift []string
}

// AllowedProvider is a Terraform provider templates may use.
type AllowedProvider struct {
	// Name is the provider's local name and the prefix of its types ("kloudlocal"); "terraform"
	// for Terraform's built-in provider.
	Name string
	// Source is the only source address a required_providers entry for Name may have
	// ("kloud/kloudlocal"; "registry.terraform.io/" may be written in front). Empty for the
	// built-in provider.
	Source string
	// Types are the resource and data source types allowed. Nil: every type "<Name>_*".
	Types []string
	// ProviderArgs are the arguments a user's provider block may set. Nil: kloud configures
	// the provider itself and a user block may only be empty (kloud replaces it).
	ProviderArgs []string
}

// PolicyError is one refused construct.
type PolicyError struct {
	File   string
	Line   int
	Column int
	// Construct names what was refused: `provisioner "local-exec"`, `function file`.
	Construct string
	Rule      string
	Detail    string
}

func (e *PolicyError) Error() string {
	return fmt.Sprintf("%s:%d:%d: %s is not allowed (rule %s): %s", e.File, e.Line, e.Column, e.Construct, e.Rule, e.Detail)
}

// hostFunctions read the host's files, or evaluate strings as templates (which could call
// them), or reveal host paths.
var hostFunctions = map[string]bool{
	"abspath": true, "file": true, "filebase64": true, "filebase64sha256": true, "filebase64sha512": true,
	"fileexists": true, "filemd5": true, "fileset": true, "filesha1": true, "filesha256": true,
	"filesha512": true, "pathexpand": true, "templatefile": true, "templatestring": true,
}

// pureFunctions are Terraform's built-in functions (1.5 to 1.11) that compute on their
// arguments only. Anything else is refused (RuleFunction), so a function added to a later
// Terraform is refused until it is reviewed and listed here.
var pureFunctions = map[string]bool{}

func init() {
	for _, n := range strings.Fields(`abs alltrue anytrue base64decode base64encode base64gzip
		base64sha256 base64sha512 basename bcrypt can ceil chomp chunklist cidrhost cidrnetmask
		cidrsubnet cidrsubnets coalesce coalescelist compact concat contains csvdecode dirname
		distinct element endswith ephemeralasnull flatten floor format formatdate formatlist indent
		index issensitive join jsondecode jsonencode keys length log lookup lower matchkeys max md5
		merge min nonsensitive one parseint plantimestamp pow range regex regexall replace reverse
		rsadecrypt sensitive setintersection setproduct setsubtract setunion sha1 sha256 sha512
		signum slice sort split startswith strcontains strrev substr sum textdecodebase64
		textencodebase64 timeadd timecmp timestamp title tobool tolist tomap tonumber toset
		tostring transpose trim trimprefix trimspace trimsuffix try upper urlencode urldecode uuid
		uuidv5 values yamldecode yamlencode zipmap
		provider::terraform::encode_tfvars provider::terraform::decode_tfvars
		provider::terraform::encode_expr`) {
		pureFunctions[n] = true
	}
}

// policyCheck collects the violations of one CheckPolicy call.
type policyCheck struct {
	p    Policy
	errs map[string]*PolicyError
}

func (pc *policyCheck) refuse(r hcl.Range, rule, construct, detail string) {
	if slices.Contains(pc.p.Lift, rule) {
		return
	}
	e := &PolicyError{File: r.Filename, Line: r.Start.Line, Column: r.Start.Column, Construct: construct, Rule: rule, Detail: detail}
	pc.errs[e.Error()] = e
}

func (pc *policyCheck) provider(name string) *AllowedProvider {
	for i := range pc.p.Providers {
		if pc.p.Providers[i].Name == name {
			return &pc.p.Providers[i]
		}
	}
	return nil
}

func (pc *policyCheck) offered() string {
	var out []string
	for _, ap := range pc.p.Providers {
		if ap.Types != nil {
			out = append(out, ap.Types...)
		} else {
			out = append(out, ap.Name+"_*")
		}
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, ", ")
}

// typeAllowed reports whether resource or data source type typ belongs to an allowed provider.
func (pc *policyCheck) typeAllowed(typ string) bool {
	for _, ap := range pc.p.Providers {
		if ap.Types != nil {
			if slices.Contains(ap.Types, typ) {
				return true
			}
		} else if strings.HasPrefix(typ, ap.Name+"_") {
			return true
		}
	}
	return false
}

const dataNotCode = "templates are data, not code: they may not run commands on, read from or point at the host that runs Terraform"

// CheckPolicy checks the template's files against policy p (see the rule constants and
// docs/template-policy.md). Every violation is a *PolicyError naming file:line:col, the
// construct and the rule; several are joined with errors.Join, sorted by position. Check the
// user's files only: what kloud's providers generate is kloud's own code.
func (c *Config) CheckPolicy(p Policy) error {
	pc := &policyCheck{p: p, errs: map[string]*PolicyError{}}
	for _, f := range c.files {
		pc.file(f)
	}
	errs := make([]*PolicyError, 0, len(pc.errs))
	for _, e := range pc.errs {
		errs = append(errs, e)
	}
	slices.SortFunc(errs, func(a, b *PolicyError) int {
		return cmp.Or(cmp.Compare(a.File, b.File), cmp.Compare(a.Line, b.Line), cmp.Compare(a.Column, b.Column), cmp.Compare(a.Error(), b.Error()))
	})
	out := make([]error, len(errs))
	for i, e := range errs {
		out[i] = e
	}
	return errors.Join(out...)
}

// allowedTop are the top-level block types a template may have.
var allowedTop = map[string]bool{"terraform": true, "variable": true, "locals": true, "output": true,
	"resource": true, "data": true, "moved": true, "removed": true, "check": true, "provider": true,
	ParameterBlock: true, PresetBlock: true}

func (pc *policyCheck) file(f *file) {
	// Top-level blocks the schema does not know, and attributes (JSON: every unknown key).
	if sb, ok := f.hcl.Body.(*hclsyntax.Body); ok {
		for _, b := range sb.Blocks {
			if _, known := schemaTypes[b.Type]; !known {
				pc.refuse(b.TypeRange, RuleBlock, fmt.Sprintf("block %q", b.Type), "not a block type templates may use")
			}
		}
		for _, a := range sb.Attributes {
			pc.refuse(a.NameRange, RuleBlock, fmt.Sprintf("top-level argument %q", a.Name), "not part of a template")
		}
	} else {
		_, rest, _ := f.hcl.Body.PartialContent(topSchema)
		attrs, _ := rest.JustAttributes()
		for n, a := range attrs {
			if n == "//" {
				continue // a JSON comment
			}
			pc.refuse(a.NameRange, RuleBlock, fmt.Sprintf("block %q", n), "not a block type templates may use")
		}
	}

	blocks, _ := f.blocks()
	for _, b := range blocks {
		r := blockRange(b)
		switch b.Type {
		case "module":
			pc.refuse(r, RuleModule, fmt.Sprintf("module %q", b.Labels[0]), "modules bring code from outside the template; put the resources in the template itself")
		case "import":
			pc.refuse(r, RuleBlock, "import block", "importing existing infrastructure by id could take over machines of other stacks")
		case "ephemeral":
			pc.refuse(r, RuleBlock, fmt.Sprintf("ephemeral %q %q", b.Labels[0], b.Labels[1]), "ephemeral resources are not offered for stacks")
		case "terraform":
			pc.terraformBlock(b)
		case "provider":
			pc.providerBlock(b)
		case "resource", "data":
			pc.resourceBlock(b)
		case "removed":
			pc.noProvisioners(b.Body)
		case "check":
			content, _, _ := b.Body.PartialContent(&hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{{Type: "data", LabelNames: []string{"type", "name"}}}})
			for _, d := range content.Blocks {
				pc.resourceBlock(d)
			}
		default:
			if !allowedTop[b.Type] {
				pc.refuse(r, RuleBlock, fmt.Sprintf("block %q", b.Type), "not a block type templates may use")
			}
		}
	}
	if f.json {
		pc.jsonExprs(f)
	} else {
		pc.nativeExprs(f)
	}
}

var schemaTypes = func() map[string]bool {
	m := map[string]bool{}
	for _, b := range topSchema.Blocks {
		m[b.Type] = true
	}
	return m
}()

func (pc *policyCheck) terraformBlock(b *hcl.Block) {
	content, rest, _ := b.Body.PartialContent(&hcl.BodySchema{
		Attributes: []hcl.AttributeSchema{{Name: "required_version"}},
		Blocks:     []hcl.BlockHeaderSchema{{Type: "required_providers"}},
	})
	for _, rp := range content.Blocks {
		for name, a := range attributes(rp.Body) {
			pc.requiredProvider(name, a)
		}
	}
	// Everything else in the terraform block.
	if sb, ok := rest.(*hclsyntax.Body); ok {
		for _, nb := range sb.Blocks {
			if nb.Type == "required_providers" {
				continue
			}
			pc.terraformSetting(nb.Type, nb.TypeRange)
		}
		for n, a := range sb.Attributes {
			if n == "required_version" {
				continue
			}
			pc.terraformSetting(n, a.NameRange)
		}
		return
	}
	attrs, _ := rest.JustAttributes()
	for n, a := range attrs {
		if n == "//" {
			continue
		}
		pc.terraformSetting(n, a.NameRange)
	}
}

func (pc *policyCheck) terraformSetting(name string, r hcl.Range) {
	switch name {
	case "backend", "cloud":
		pc.refuse(r, RuleBackend, fmt.Sprintf("terraform %s", name), "kloud keeps every stack's state itself; a backend could read or write state at host paths or elsewhere")
	default:
		pc.refuse(r, RuleBlock, fmt.Sprintf("terraform %s", name), "a template's terraform block may hold only required_version and required_providers")
	}
}

// requiredProvider checks a required_providers entry: an offered provider at its source.
func (pc *policyCheck) requiredProvider(name string, a *hcl.Attribute) {
	construct := fmt.Sprintf("required_providers entry %q", name)
	ap := pc.provider(name)
	if ap == nil || ap.Source == "" {
		pc.refuse(a.NameRange, RuleProvider, construct, fmt.Sprintf("kloud's providers offer only %s to templates", pc.offered()))
		return
	}
	src := ""
	if v, diags := a.Expr.Value(nil); !diags.HasErrors() && v.IsWhollyKnown() && !v.IsNull() && v.Type().IsObjectType() && v.Type().HasAttribute("source") {
		if s := v.GetAttr("source"); s.Type() == cty.String && !s.IsNull() {
			src = s.AsString()
		}
	}
	if !sameSource(src, ap.Source) {
		pc.refuse(a.Expr.Range(), RuleProvider, construct, fmt.Sprintf("the source of %s must be %q (found %q)", name, ap.Source, src))
	}
}

func (pc *policyCheck) providerBlock(b *hcl.Block) {
	name := b.Labels[0]
	construct := fmt.Sprintf("provider %q", name)
	ap := pc.provider(name)
	if ap == nil || ap.Source == "" {
		pc.refuse(blockRange(b), RuleProvider, construct, fmt.Sprintf("kloud's providers offer only %s to templates", pc.offered()))
		return
	}
	if sb, ok := b.Body.(*hclsyntax.Body); ok {
		for _, nb := range sb.Blocks {
			pc.refuse(nb.TypeRange, RuleProvider, fmt.Sprintf("%s block %q", construct, nb.Type), "kloud configures this provider itself")
		}
	}
	for n, a := range attributes(b.Body) {
		if !slices.Contains(ap.ProviderArgs, n) {
			pc.refuse(a.NameRange, RuleProvider, fmt.Sprintf("%s argument %s", construct, n), "kloud configures this provider itself; leave the block empty or remove it")
		}
	}
}

// resourceBlock checks a resource or data block: an offered type, an offered provider, no
// provisioners.
func (pc *policyCheck) resourceBlock(b *hcl.Block) {
	typ := b.Labels[0]
	construct := fmt.Sprintf("%s %q %q", b.Type, typ, b.Labels[1])
	if b.Type == "resource" && typ == BucketType {
		// A bucket claim: kloud's own, never Terraform's (bucket.go; Buckets checks its
		// arguments, RemoveBuckets takes it out of what Terraform sees).
		pc.noProvisioners(b.Body)
		return
	}
	switch {
	case typ == "terraform_remote_state" && !pc.typeAllowed(typ):
		pc.refuse(b.LabelRanges[0], RuleProvider, construct, "terraform_remote_state reads state files and backends outside the stack")
	case !pc.typeAllowed(typ):
		pc.refuse(b.LabelRanges[0], RuleProvider, construct, fmt.Sprintf("type %s is not offered for stacks (offered: %s)", typ, pc.offered()))
	}
	if a := attributes(b.Body)["provider"]; a != nil {
		t, diags := hcl.AbsTraversalForExpr(a.Expr)
		if diags.HasErrors() || pc.provider(t.RootName()) == nil {
			pc.refuse(a.Expr.Range(), RuleProvider, construct+" provider argument", "only the providers kloud offers may be named")
		}
	}
	pc.noProvisioners(b.Body)
}

var provisionerSchema = &hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{
	{Type: "provisioner", LabelNames: []string{"type"}},
	{Type: "connection"},
}}

func (pc *policyCheck) noProvisioners(body hcl.Body) {
	content, _, _ := body.PartialContent(provisionerSchema)
	for _, b := range content.Blocks {
		pc.provisioner(b.Type, b.Labels, blockRange(b))
	}
}

func (pc *policyCheck) provisioner(typ string, labels []string, r hcl.Range) {
	construct := typ
	if len(labels) > 0 {
		construct = fmt.Sprintf("%s %q", typ, labels[0])
	}
	pc.refuse(r, RuleProvisioner, construct, dataNotCode)
}

// nativeExprs checks every expression and nested block of an HCL file.
func (pc *policyCheck) nativeExprs(f *file) {
	body := f.hcl.Body.(*hclsyntax.Body)
	// Type constraints (list(string), optional(...)) are not function calls.
	var skip []hcl.Range
	for _, b := range body.Blocks {
		if b.Type == "variable" {
			if a := b.Body.Attributes["type"]; a != nil {
				skip = append(skip, a.Expr.Range())
			}
		}
	}
	inSkip := func(r hcl.Range) bool {
		for _, s := range skip {
			if s.Filename == r.Filename && r.Start.Byte >= s.Start.Byte && r.End.Byte <= s.End.Byte {
				return true
			}
		}
		return false
	}
	pc.visit(body, inSkip, nil)
}

// visit checks the blocks, function calls and references under n (a body or an expression).
// at, if not nil, is the range reported for everything found (a JSON string, whose escapes
// make positions inside it differ from the file's).
func (pc *policyCheck) visit(n hclsyntax.Node, skip func(hcl.Range) bool, at *hcl.Range) {
	where := func(r hcl.Range) hcl.Range {
		if at != nil {
			return *at
		}
		return r
	}
	var keys []hcl.Range // object keys written as bare words: { path = "x" } is not path.*
	hclsyntax.VisitAll(n, func(n hclsyntax.Node) hcl.Diagnostics {
		switch n := n.(type) {
		case *hclsyntax.Block:
			switch {
			case n.Type == "provisioner" || n.Type == "connection":
				pc.provisioner(n.Type, n.Labels, where(n.TypeRange))
			case n.Type == "dynamic" && len(n.Labels) == 1 && (n.Labels[0] == "provisioner" || n.Labels[0] == "connection"):
				pc.provisioner(n.Labels[0], nil, where(n.TypeRange))
			}
		case *hclsyntax.ObjectConsKeyExpr:
			if hcl.ExprAsKeyword(n) != "" {
				keys = append(keys, n.Wrapped.Range())
			}
		case *hclsyntax.FunctionCallExpr:
			if skip == nil || !skip(n.Range()) {
				pc.function(n.Name, where(n.NameRange))
			}
		case *hclsyntax.ScopeTraversalExpr:
			if !slices.Contains(keys, n.Range()) {
				pc.traversal(n.Traversal, where(n.SrcRange))
			}
		}
		return nil
	})
}

func (pc *policyCheck) function(name string, r hcl.Range) {
	construct := fmt.Sprintf("function %s", name)
	switch {
	case hostFunctions[name]:
		pc.refuse(r, RuleHostFunction, construct, "it reads files of the host that runs Terraform (or evaluates a template that could)")
	case pureFunctions[name]:
	case strings.HasPrefix(name, "provider::"):
		parts := strings.Split(name, "::")
		if len(parts) != 3 || pc.provider(parts[1]) == nil || pc.provider(parts[1]).Source == "" {
			pc.refuse(r, RuleProvider, construct, "a function of a provider kloud does not offer")
		}
	default:
		pc.refuse(r, RuleFunction, construct, "not one of the Terraform functions templates may use")
	}
}

func (pc *policyCheck) traversal(t hcl.Traversal, r hcl.Range) {
	if t.RootName() != "path" {
		return
	}
	attr := ""
	if len(t) > 1 {
		if a, ok := t[1].(hcl.TraverseAttr); ok {
			attr = "." + a.Name
		}
	}
	pc.refuse(r, RuleHostFunction, "path"+attr, "it is a path on the host that runs Terraform")
}

// jsonExprs checks every string (keys included) of a JSON file as the template Terraform
// would evaluate it. The file is read as one JSON value, so repeated keys (which Terraform
// merges for blocks) are all seen.
func (pc *policyCheck) jsonExprs(f *file) {
	e, diags := hcljson.ParseExpression(f.src, f.name)
	if diags.HasErrors() {
		return // Parse accepted the file; this does not happen
	}
	pc.jsonValue(e, nil)
}

func (pc *policyCheck) jsonValue(e hcl.Expression, path []string) {
	if len(path) == 3 && path[0] == "variable" && path[2] == "type" {
		return // a type constraint
	}
	if m, ok := e.(interface{ ExprMap() []hcl.KeyValuePair }); ok {
		if items := m.ExprMap(); items != nil {
			for _, kv := range items {
				pc.jsonValue(kv.Key, nil)
				key := ""
				if k, diags := kv.Key.Value(nil); !diags.HasErrors() && k.Type() == cty.String && !k.IsNull() {
					key = k.AsString()
				}
				pc.jsonValue(kv.Value, append(slices.Clip(path), key))
			}
			return
		}
	}
	if l, ok := e.(interface{ ExprList() []hcl.Expression }); ok {
		if items := l.ExprList(); items != nil {
			for _, it := range items {
				pc.jsonValue(it, path) // arrays of blocks: the same path
			}
			return
		}
	}
	v, diags := e.Value(nil)
	if diags.HasErrors() || v.Type() != cty.String || v.IsNull() {
		return
	}
	r := e.Range()
	start := r.Start
	if r.End.Byte-r.Start.Byte >= 2 { // skip the opening quote
		start = hcl.Pos{Line: r.Start.Line, Column: r.Start.Column + 1, Byte: r.Start.Byte + 1}
	}
	tmpl, diags := hclsyntax.ParseTemplate([]byte(v.AsString()), r.Filename, start)
	if diags.HasErrors() {
		return // not a template Terraform could evaluate either
	}
	pc.visit(tmpl, nil, &r)
}
