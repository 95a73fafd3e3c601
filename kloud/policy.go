package kloud

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/provider/tmpl"
)

// The template policy (provider/tmpl's CheckPolicy, docs/template-policy.md): templates are
// data, not code. kloud checks a template's files at template.create and template.update, and
// again in build() before every stack.plan, stack.create and build, at stack.apply before the
// job starts, and at destroy, so a template stored before the policy existed (or written to the
// store directly) does not run either. Only the user's files are checked; what providers add in
// ApplyTemplate is kloud's own code. With the policy, at each of those places, the rules of the
// providers the template uses (provider.TemplateValidator: the docker provider's arguments,
// names a provider reserves): a template a provider would refuse at build is refused at save.
// Before a destroy they are only logged (templatePolicy.checkDestroy).
//
// A kloud administrator may trust one revision of a template (template.trust), lifting named
// rules for exactly its files: the trust record holds a digest of the files, so any change of
// them is a new revision that is not trusted. Records live on the template document (field
// "trust": who, when, which rules, why) and every trust and untrust is logged at WARN.

// filesDigest identifies a template's files: sha256 over names and contents.
func filesDigest(files map[string][]byte) string {
	h := sha256.New()
	for _, n := range sortedNames(files) {
		var l [8]byte
		binary.BigEndian.PutUint64(l[:], uint64(len(n)))
		h.Write(l[:])
		h.Write([]byte(n))
		binary.BigEndian.PutUint64(l[:], uint64(len(files[n])))
		h.Write(l[:])
		h.Write(files[n])
	}
	return hex.EncodeToString(h.Sum(nil))
}

func sortedNames(files map[string][]byte) []string {
	out := make([]string, 0, len(files))
	for n := range files {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// templatePolicy checks templates against kloud's template policy and its providers' rules,
// and serves template.trust and template.untrust (routes.go): the trust records that lift
// rules for one revision of a template. It holds the templates repository and the provider
// registry. The Server's checkPolicy, checkPolicyParsed, checkDestroyPolicy and trust, which
// other areas call, hand their work to it.
type templatePolicy struct {
	templates *store.Templates
	providers *provider.Registry
	now       func() time.Time // the store's clock (store.Store.Now)
	log       *slog.Logger
	// loadTemplate is Server.loadTemplate (templates.go): a template as c may see it.
	loadTemplate func(ctx context.Context, c *Caller, id string) (*model.Template, error)
}

// checkPolicy is templatePolicy.check.
func (s *Server) checkPolicy(ctx context.Context, team string, files map[string][]byte, extraLift ...string) error {
	return s.policy.check(ctx, team, files, extraLift...)
}

// checkPolicyParsed is templatePolicy.checkParsed.
func (s *Server) checkPolicyParsed(ctx context.Context, team string, files map[string][]byte, cfg *tmpl.Config, extraLift ...string) error {
	return s.policy.checkParsed(ctx, team, files, cfg, extraLift...)
}

// checkDestroyPolicy is templatePolicy.checkDestroy.
func (s *Server) checkDestroyPolicy(ctx context.Context, team string, files map[string][]byte) error {
	return s.policy.checkDestroy(ctx, team, files)
}

// trustSpec is trustRules.
func (s *Server) trustSpec(c *Caller, spec *api.TrustSpec) ([]string, error) {
	return trustRules(c, spec)
}

// trust is templatePolicy.recordTrust.
func (s *Server) trust(ctx context.Context, c *Caller, t *model.Template, rev int, files []model.File, spec *api.TrustSpec) (model.TemplateTrust, error) {
	return s.policy.recordTrust(ctx, c, t, rev, files, spec)
}

// check checks a template's (user's) files against the policy of kloud's providers,
// lifting the rules an administrator trusted these exact files with in team, and extraLift
// (an administrator's template.create or template.update with trust), and against the rules of
// the providers the template uses (providerRules). Violations are invalid params naming
// file:line[:col], the construct and the rule.
func (p *templatePolicy) check(ctx context.Context, team string, files map[string][]byte, extraLift ...string) error {
	cfg, err := tmpl.Parse(files)
	if err != nil {
		return fmt.Errorf("template: %s: %w", err.Error(), kite.ErrInvalidParams)
	}
	return p.checkParsed(ctx, team, files, cfg, extraLift...)
}

// checkParsed is check for files already parsed (cfg, not yet rewritten).
func (p *templatePolicy) checkParsed(ctx context.Context, team string, files map[string][]byte, cfg *tmpl.Config, extraLift ...string) error {
	policy, err := p.refusal(ctx, team, files, cfg, extraLift...)
	if err != nil {
		return err
	}
	found, err := p.providerRules(ctx, files, cfg)
	if err != nil {
		return err
	}
	return refused(policy, found)
}

// checkDestroy is check before a destroy (terraform destroy evaluates the stack's
// files): the template policy refuses, the providers' rules are checked and logged but do not.
// They say what machines a provider builds, a destroy builds none, and a stack whose files
// break a provider's rule (built by an older kloud, or left by a refused update of an older
// kloud, with its machines still there) must still be destroyable: nothing could lift the
// refusal.
func (p *templatePolicy) checkDestroy(ctx context.Context, team string, files map[string][]byte) error {
	cfg, err := tmpl.Parse(files)
	if err != nil {
		return fmt.Errorf("template: %s: %w", err.Error(), kite.ErrInvalidParams)
	}
	policy, err := p.refusal(ctx, team, files, cfg)
	if err != nil {
		return err
	}
	found, err := p.providerRules(ctx, files, cfg)
	if err != nil {
		p.log.WarnContext(ctx, "destroy: the providers' template rules could not be checked", "err", err)
	} else if rerr := refused("", found); rerr != nil {
		p.log.WarnContext(ctx, "destroy of a stack whose files break a provider's template rules (destroyed anyway)", "team", team, "refusal", rerr.Error())
	}
	return refused(policy, nil)
}

// refusal is the template policy's refusal of files ("" if they pass).
func (p *templatePolicy) refusal(ctx context.Context, team string, files map[string][]byte, cfg *tmpl.Config, extraLift ...string) (string, error) {
	lift, err := p.trustedRules(ctx, team, filesDigest(files))
	if err != nil {
		return "", err
	}
	lift = append(lift, extraLift...)
	if err := cfg.CheckPolicy(p.providers.TemplatePolicy(lift...)); err != nil {
		return "template refused by kloud's template policy (see docs/template-policy.md; a kloud administrator can trust a template with `kloud template trust`):\n" + err.Error(), nil
	}
	return "", nil
}

// refused is the invalid params error of the policy's refusal and the providers' findings
// (by provider), nil if there are none.
func refused(policy string, found map[string][]provider.TemplateFinding) error {
	var refusals []string
	if policy != "" {
		refusals = append(refusals, policy)
	}
	for _, name := range slices.Sorted(maps.Keys(found)) {
		msgs := make([]string, len(found[name]))
		for i, f := range found[name] {
			msgs[i] = f.Error()
		}
		refusals = append(refusals, fmt.Sprintf("template refused by the %s provider's rules (see docs/template-policy.md#provider-rules):\n%s", name, strings.Join(msgs, "\n")))
	}
	if len(refusals) == 0 {
		return nil
	}
	return fmt.Errorf("%s: %w", strings.Join(refusals, "\n"), kite.ErrInvalidParams)
}

// providerRules asks every provider the template uses (a machine resource of its type, or its
// Terraform provider named) that has rules of its own (provider.CapTemplateRules) for its
// findings in the user's files: by provider name, only those with findings. Provider rules are
// not lifted by a trust: they say what the provider's machines may be, not what Terraform may
// run, and the provider checks them again when it builds.
func (p *templatePolicy) providerRules(ctx context.Context, files map[string][]byte, cfg *tmpl.Config) (map[string][]provider.TemplateFinding, error) {
	used := cfg.Providers()
	out := map[string][]provider.TemplateFinding{}
	for _, name := range p.providers.Names() {
		pr, err := p.providers.Lookup(name)
		if err != nil || !pr.Can(provider.CapTemplateRules) {
			continue
		}
		uses := len(cfg.Resources(pr.ResourceType)) > 0
		for _, tp := range pr.TerraformProviders() {
			uses = uses || slices.Contains(used, tp.Name)
		}
		if !uses {
			continue
		}
		st, err := pr.Stack(&provider.BaseStack{Provider: pr, Log: p.log.With("provider", name)})
		if err != nil {
			return nil, fmt.Errorf("provider %s: %w", name, err)
		}
		tv, ok := st.(provider.TemplateValidator)
		if !ok {
			// Advertised but not implemented: the conformance suite fails such a provider.
			p.log.WarnContext(ctx, "provider advertises template rules but its stack does not check them", "provider", name)
			continue
		}
		fs, err := tv.ValidateTemplate(ctx, files)
		if err != nil {
			return nil, fmt.Errorf("provider %s: check the template against its rules: %w", name, err)
		}
		if len(fs) > 0 {
			out[name] = fs
		}
	}
	return out, nil
}

// trustedRules returns the rules lifted for files with this digest in team.
func (p *templatePolicy) trustedRules(ctx context.Context, team, digest string) ([]string, error) {
	ts, err := p.templates.Trusted(ctx, team)
	if err != nil {
		return nil, fmt.Errorf("load template trust: %w", err)
	}
	var out []string
	for _, t := range ts {
		for _, tr := range t.Trust {
			if tr.Digest != digest {
				continue
			}
			for _, r := range tr.Rules {
				if !slices.Contains(out, r) {
					out = append(out, r)
				}
			}
		}
	}
	slices.Sort(out)
	return out, nil
}

// revisionFiles returns the files of revision rev of t (0: the current one).
func revisionFiles(t *model.Template, rev int) (int, []model.File, error) {
	if rev == 0 || rev == t.Rev {
		return t.Rev, t.Files, nil
	}
	for _, r := range t.Revisions {
		if r.Rev == rev {
			return r.Rev, r.Files, nil
		}
	}
	return 0, nil, fmt.Errorf("template %s has no revision %d (kept: the last %d): %w", t.ID, rev, maxRevisions, kite.ErrNotFound)
}

// templateTrust (template.trust) trusts a revision of a template: lifts the rules it names for
// exactly its files (owners and template admins).
func (p *templatePolicy) templateTrust(ctx context.Context, c *Caller, _ *kite.Request, params *api.TrustParams) (model.TemplateTrust, error) {
	spec := &api.TrustSpec{Rules: params.Rules, Reason: params.Reason}
	if _, err := trustRules(c, spec); err != nil {
		return model.TemplateTrust{}, err
	}
	t, err := p.loadTemplate(ctx, templateAdminView(c), params.TemplateID)
	if err != nil {
		return model.TemplateTrust{}, err
	}
	rev, files, err := revisionFiles(t, params.Revision)
	if err != nil {
		return model.TemplateTrust{}, err
	}
	return p.recordTrust(ctx, c, t, rev, files, spec)
}

// templateAdminView is the caller as it reads templates: a template admin sees every team's
// (to review and trust them), as an owner does.
func templateAdminView(c *Caller) *Caller {
	if !c.TemplateAdmin() || c.Admin {
		return c
	}
	v := *c
	v.Admin = true
	return &v
}

// trustRules checks an administrator's trust and returns the rules it lifts (none for nil).
func trustRules(c *Caller, spec *api.TrustSpec) ([]string, error) {
	if spec == nil {
		return nil, nil
	}
	if !c.TemplateAdmin() {
		return nil, fmt.Errorf("only a kloud owner or template admin may trust a template: %w", kite.ErrPermission)
	}
	if len(spec.Rules) == 0 {
		return nil, fmt.Errorf("say which rules to lift (rules: %s): %w", strings.Join(tmpl.PolicyRules, ", "), kite.ErrInvalidParams)
	}
	for _, r := range spec.Rules {
		if !slices.Contains(tmpl.PolicyRules, r) {
			return nil, fmt.Errorf("unknown rule %q (rules: %s): %w", r, strings.Join(tmpl.PolicyRules, ", "), kite.ErrInvalidParams)
		}
	}
	if strings.TrimSpace(spec.Reason) == "" {
		return nil, fmt.Errorf("a reason is required: it is kept with the trust: %w", kite.ErrInvalidParams)
	}
	return spec.Rules, nil
}

// recordTrust records that revision rev (with files) of t is trusted with spec, and logs it.
func (p *templatePolicy) recordTrust(ctx context.Context, c *Caller, t *model.Template, rev int, files []model.File, spec *api.TrustSpec) (model.TemplateTrust, error) {
	rules := slices.Clone(spec.Rules)
	slices.Sort(rules)
	rules = slices.Compact(rules)
	tr := model.TemplateTrust{Rev: rev, Digest: filesDigest(fileMap(files)), Rules: rules, Reason: strings.TrimSpace(spec.Reason), By: c.Username, At: p.now()}
	if err := p.setTrust(ctx, t.ID, func(cur []model.TemplateTrust) []model.TemplateTrust {
		cur = slices.DeleteFunc(cur, func(x model.TemplateTrust) bool { return x.Rev == rev })
		return append(cur, tr)
	}); err != nil {
		return model.TemplateTrust{}, err
	}
	p.log.WarnContext(ctx, "template trusted: policy rules lifted", "template", t.ID, "title", t.Title, "team", t.Team, "rev", rev,
		"rules", strings.Join(rules, ","), "by", c.Username, "reason", tr.Reason, "digest", tr.Digest)
	return tr, nil
}

// templateUntrust (template.untrust) removes the trust of one revision of a template, or of all
// of them (revision 0; owners and template admins).
func (p *templatePolicy) templateUntrust(ctx context.Context, c *Caller, _ *kite.Request, params *api.TrustParams) (api.UntrustResult, error) {
	if !c.TemplateAdmin() {
		return api.UntrustResult{}, fmt.Errorf("only a kloud owner or template admin may untrust a template: %w", kite.ErrPermission)
	}
	t, err := p.loadTemplate(ctx, templateAdminView(c), params.TemplateID)
	if err != nil {
		return api.UntrustResult{}, err
	}
	removed := 0
	if err := p.setTrust(ctx, t.ID, func(cur []model.TemplateTrust) []model.TemplateTrust {
		n := len(cur)
		cur = slices.DeleteFunc(cur, func(x model.TemplateTrust) bool { return params.Revision == 0 || x.Rev == params.Revision })
		removed = n - len(cur)
		return cur
	}); err != nil {
		return api.UntrustResult{}, err
	}
	p.log.WarnContext(ctx, "template untrusted", "template", t.ID, "title", t.Title, "team", t.Team, "rev", params.Revision, "removed", removed, "by", c.Username)
	return api.UntrustResult{TemplateID: t.ID, Removed: removed}, nil
}

// setTrust rewrites a template's trust records (the last of two concurrent administrators
// wins; both are logged).
func (p *templatePolicy) setTrust(ctx context.Context, id string, change func([]model.TemplateTrust) []model.TemplateTrust) error {
	cur, err := p.templates.Get(ctx, id)
	if err != nil {
		return err
	}
	next := change(slices.Clone(cur.Trust))
	if err := p.templates.SetTrust(ctx, id, next); err != nil {
		return fmt.Errorf("save template trust: %w", err)
	}
	return nil
}
