package kloud

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/stackbuild"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/provider/tmpl"
)

// Templates: Terraform configurations (HCL or JSON) with revisions, shared in a team.

// maxRevisions is how many earlier revisions a template keeps.
const maxRevisions = 20

// templateAPI serves template.create, update, get, list and delete. Trust and policy are
// policy.go's, caps limits.go's; loadTemplate and machineResources, which other areas use too,
// stay on Server.
type templateAPI struct {
	templates *store.Templates
	now       func() time.Time // the store's clock
	srv       templateServer
}

// templateServer is what the template area uses of Server (which implements it).
type templateServer interface {
	loadTemplate(ctx context.Context, c *Caller, id string) (*model.Template, error)
	machineResources(files map[string][]byte) (*tmpl.Config, map[string][]tmpl.Resource, error)
	templateParams(cfg *tmpl.Config) (*tmpl.Params, error) // params.go
	// policy.go
	trustSpec(c *Caller, spec *api.TrustSpec) ([]string, error)
	checkPolicy(ctx context.Context, team string, files map[string][]byte, extraLift ...string) error
	trust(ctx context.Context, c *Caller, t *model.Template, rev int, files []model.File, spec *api.TrustSpec) (model.TemplateTrust, error)
	// limits.go
	checkTemplateCap(t *model.Template, files map[string][]byte) error
}

func filesOf(m map[string]string) []model.File {
	out := make([]model.File, 0, len(m))
	for n, c := range m {
		out = append(out, model.File{Name: n, Content: c})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func fileMap(fs []model.File) map[string][]byte { return stackbuild.FileMap(fs) }

// machineResources lists the machine resources a template declares, per provider, and the
// providers it needs. Syntax errors come back as invalid params with file and line.
func (s *Server) machineResources(files map[string][]byte) (*tmpl.Config, map[string][]tmpl.Resource, error) {
	cfg, err := tmpl.Parse(files)
	if err != nil {
		return nil, nil, fmt.Errorf("template: %s: %w", err.Error(), kite.ErrInvalidParams)
	}
	out := map[string][]tmpl.Resource{}
	for _, name := range s.providers.Names() {
		p, _ := s.providers.Lookup(name)
		for _, r := range cfg.Resources(p.ResourceType) {
			if strings.HasPrefix(r.Name, "kloud_") {
				continue // kloud's own generated resources
			}
			if r.ForEach {
				return nil, nil, fmt.Errorf("template: %s:%d: %s.%s uses for_each; machine resources use count: %w", r.File, r.Line, r.Type, r.Name, kite.ErrInvalidParams)
			}
			out[name] = append(out[name], r)
		}
	}
	return cfg, out, nil
}

// templateTeam resolves the team a template is created in: the one asked for (the caller's),
// else the caller's only team, else the default team if the caller is in it.
func templateTeam(c *Caller, team string) (string, error) {
	if team != "" {
		if !c.InTeam(team) {
			return "", fmt.Errorf("you are not in team %q: %w", team, kite.ErrPermission)
		}
		return team, nil
	}
	if len(c.Teams) == 1 {
		for t := range c.Teams {
			return t, nil
		}
	}
	if c.InTeam(model.DefaultTeam) {
		return model.DefaultTeam, nil
	}
	return "", fmt.Errorf("say which team (--team): you are in %d teams: %w", len(c.Teams), kite.ErrInvalidParams)
}

func (a *templateAPI) create(ctx context.Context, c *Caller, _ *kite.Request, p *api.TemplateParams) (model.Template, error) {
	if p.TemplateID != "" {
		return model.Template{}, fmt.Errorf("template.create takes no id: %w", kite.ErrInvalidParams)
	}
	if strings.TrimSpace(p.Title) == "" || len(p.Files) == 0 {
		return model.Template{}, fmt.Errorf("a template needs a title and at least one file: %w", kite.ErrInvalidParams)
	}
	team, err := templateTeam(c, p.Team)
	if err != nil {
		return model.Template{}, err
	}
	files := filesOf(p.Files)
	cfg, res, err := a.srv.machineResources(fileMap(files))
	if err != nil {
		return model.Template{}, err
	}
	if _, err := a.srv.templateParams(cfg); err != nil { // params.go
		return model.Template{}, err
	}
	lift, err := a.srv.trustSpec(c, p.Trust)
	if err != nil {
		return model.Template{}, err
	}
	if err := a.srv.checkPolicy(ctx, team, fileMap(files), lift...); err != nil {
		return model.Template{}, err
	}
	if p.MaxMachines != 0 {
		return model.Template{}, fmt.Errorf("template.create takes no maxMachines: an administrator sets it with template.update: %w", kite.ErrInvalidParams)
	}
	if p.IdleTimeout != "" || p.AlwaysOn != nil {
		return model.Template{}, fmt.Errorf("template.create takes no idleTimeout or alwaysOn: set them with template.update: %w", kite.ErrInvalidParams)
	}
	if err := a.srv.checkTemplateCap(nil, fileMap(files)); err != nil { // limits.go
		return model.Template{}, err
	}
	now := a.now()
	t := model.Template{ID: store.NewID(), Title: strings.TrimSpace(p.Title), Description: p.Description, Team: team, Owner: c.Username,
		Rev: 1, Files: files, Providers: providerNames(res), CreatedAt: now, UpdatedAt: now}
	if err := a.templates.Insert(ctx, t); err != nil {
		return model.Template{}, fmt.Errorf("save template: %w", err)
	}
	if p.Trust != nil {
		if _, err := a.srv.trust(ctx, c, &t, t.Rev, t.Files, p.Trust); err != nil {
			return model.Template{}, err
		}
	}
	return t, nil
}

func providerNames(res map[string][]tmpl.Resource) []string {
	return slices.Sorted(maps.Keys(res))
}

func (s *Server) loadTemplate(ctx context.Context, c *Caller, id string) (*model.Template, error) {
	t, err := s.store.Templates().Get(ctx, id)
	if errors.Is(err, store.ErrNotFound) || err == nil && !c.InTeam(t.Team) {
		return nil, notFound("template", id)
	}
	if err != nil {
		return nil, err
	}
	return &t, nil
}

func (a *templateAPI) update(ctx context.Context, c *Caller, _ *kite.Request, p *api.TemplateParams) (model.Template, error) {
	t, err := a.srv.loadTemplate(ctx, c, p.TemplateID)
	if err != nil {
		return model.Template{}, err
	}
	if !c.CanManage(t.Owner, t.Team) {
		return model.Template{}, fmt.Errorf("template %s belongs to %s: %w", t.ID, t.Owner, kite.ErrPermission)
	}
	u := store.TemplateUpdate{Title: strings.TrimSpace(p.Title), Description: p.Description}
	if p.MaxMachines != 0 { // limits.go
		if err := setTemplateCap(c, p.MaxMachines); err != nil {
			return model.Template{}, err
		}
		u.MaxMachines, t.MaxMachines = p.MaxMachines, p.MaxMachines
	}
	idle, setIdle, err := templateIdle(p, t.Idle) // idle.go
	if err != nil {
		return model.Template{}, err
	}
	if len(p.Files) > 0 {
		files := filesOf(p.Files)
		cfg, res, err := a.srv.machineResources(fileMap(files))
		if err != nil {
			return model.Template{}, err
		}
		if _, err := a.srv.templateParams(cfg); err != nil { // params.go
			return model.Template{}, err
		}
		// A new revision: trust given to an earlier one does not carry over (it is bound to
		// the earlier files' digest).
		lift, err := a.srv.trustSpec(c, p.Trust)
		if err != nil {
			return model.Template{}, err
		}
		if err := a.srv.checkPolicy(ctx, t.Team, fileMap(files), lift...); err != nil {
			return model.Template{}, err
		}
		if err := a.srv.checkTemplateCap(t, fileMap(files)); err != nil { // limits.go
			return model.Template{}, err
		}
		u.Files, u.Providers, u.Rev = files, providerNames(res), t.Rev+1
		revs := append([]model.TemplateRevision{{Rev: t.Rev, Files: t.Files, Author: t.Owner, CreatedAt: t.UpdatedAt}}, t.Revisions...)
		if len(revs) > maxRevisions {
			revs = revs[:maxRevisions]
		}
		u.Revisions = revs
	}
	// Conditional on the revision we read: two concurrent updates cannot both win.
	ok, err := a.templates.Update(ctx, t.ID, t.Rev, u)
	if err != nil {
		return model.Template{}, fmt.Errorf("save template: %w", err)
	}
	if !ok {
		return model.Template{}, fmt.Errorf("template %s changed meanwhile; get it again: %w", t.ID, kite.ErrConflict)
	}
	if setIdle {
		if err := a.templates.SetIdle(ctx, t.ID, idle); err != nil {
			return model.Template{}, fmt.Errorf("save template: %w", err)
		}
	}
	nt, err := a.srv.loadTemplate(ctx, c, t.ID)
	if err != nil {
		return model.Template{}, err
	}
	if p.Trust != nil && len(p.Files) > 0 {
		if _, err := a.srv.trust(ctx, c, nt, nt.Rev, nt.Files, p.Trust); err != nil {
			return model.Template{}, err
		}
	}
	return *nt, nil
}

func (a *templateAPI) get(ctx context.Context, c *Caller, _ *kite.Request, p *api.TemplateGetParams) (api.TemplateView, error) {
	t, err := a.srv.loadTemplate(ctx, templateAdminView(c), p.TemplateID)
	if err != nil {
		return api.TemplateView{}, err
	}
	if p.Rev != 0 && p.Rev != t.Rev {
		rev, files, err := revisionFiles(t, p.Rev)
		if err != nil {
			return api.TemplateView{}, err
		}
		t.Rev, t.Files = rev, files
	}
	return api.TemplateView{Template: *t, Trust: t.Trust}, nil
}

func (a *templateAPI) list(ctx context.Context, c *Caller, _ *kite.Request, p *api.TemplateListParams) (api.TemplateListResult, error) {
	var ts []model.Template
	var err error
	switch {
	case p.Team != "":
		if !c.InTeam(p.Team) {
			return api.TemplateListResult{}, fmt.Errorf("you are not in team %q: %w", p.Team, kite.ErrPermission)
		}
		ts, err = a.templates.OfTeams(ctx, []string{p.Team})
	case c.Admin || c.TemplateAdmin():
		ts, err = a.templates.List(ctx)
	default:
		ts, err = a.templates.OfTeams(ctx, c.TeamNames())
	}
	if err != nil {
		return api.TemplateListResult{}, err
	}
	out := []api.TemplateSummary{}
	for _, t := range ts {
		out = append(out, api.TemplateSummary{ID: t.ID, Title: t.Title, Team: t.Team, Owner: t.Owner, Rev: t.Rev, Providers: t.Providers})
	}
	return api.TemplateListResult{Templates: out}, nil
}

func (a *templateAPI) delete(ctx context.Context, c *Caller, _ *kite.Request, p *api.TemplateRef) (api.DeleteResult, error) {
	t, err := a.srv.loadTemplate(ctx, c, p.TemplateID)
	if err != nil {
		return api.DeleteResult{}, err
	}
	if !c.CanManage(t.Owner, t.Team) {
		return api.DeleteResult{}, fmt.Errorf("template %s belongs to %s: %w", t.ID, t.Owner, kite.ErrPermission)
	}
	// Stacks keep their own copy of the revision they were made from, so they are unaffected.
	if err := a.templates.Delete(ctx, t.ID); err != nil {
		return api.DeleteResult{}, err
	}
	return api.DeleteResult{Deleted: true}, nil
}

// EnsureTemplate creates a template owned by the admin in the default team unless one with this
// title exists there; it returns the template's id (kloud serve's demo template uses it).
func (s *Server) EnsureTemplate(ctx context.Context, title string, files map[string]string) (id string, created bool, err error) {
	t, err := s.store.Templates().ByTitle(ctx, model.DefaultTeam, title)
	if err == nil {
		return t.ID, false, nil
	}
	if !errors.Is(err, store.ErrNotFound) {
		return "", false, err
	}
	c, err := s.callerByName(ctx, Admin, true)
	if err != nil {
		return "", false, err
	}
	res, err := s.templates.create(ctx, c, nil, &api.TemplateParams{Title: title, Team: model.DefaultTeam, Files: files})
	if err != nil {
		return "", false, err
	}
	return res.ID, true, nil
}
