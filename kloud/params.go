package kloud

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/provider/tmpl"
)

// Typed parameters and presets (docs/user-guide.md "Parameters and presets"): a template's
// variables, with its kloud_parameter and kloud_preset blocks (provider/tmpl params.go), are
// checked when the template is saved, listed by template.parameters, and the values stack.create
// and stack.update are given are checked against them before any terraform runs. Values are
// kept on the stack in Terraform's -var form (Stack.Variables; sensitive ones in
// Stack.SecretVariables, never in a response or a job's params); build turns them into typed
// values for terraform (tmpl.TypedValue).
//
// Parameters are read from the revision's files each time (a parse takes milliseconds) rather
// than stored next to them: the files stay the one truth, and templates saved before parameters
// existed have them too.

// credentialVariableNames are the variables kloud fills from credentials (credentialVariables,
// credential_secrets.go): <provider>_<field> for the fields of the providers' credential and
// bootstrap parts. They are not parameters.
func (s *Server) credentialVariableNames() map[string]bool {
	out := map[string]bool{}
	for _, name := range s.providers.Names() {
		p, _ := s.providers.Lookup(name)
		for _, part := range []string{provider.PartCredential, provider.PartBootstrap} {
			var sch struct {
				Properties map[string]json.RawMessage `json:"properties"`
			}
			if raw := p.JSONSchema(part); raw != nil && json.Unmarshal(raw, &sch) == nil {
				for k := range sch.Properties {
					out[name+"_"+k] = true
				}
			}
		}
	}
	return out
}

// templateParams reads the parameters of parsed files. Problems (a kloud_parameter naming no
// variable, an unknown argument, a preset's invalid value) are invalid params naming file:line.
func (s *Server) templateParams(cfg *tmpl.Config) (*tmpl.Params, error) {
	creds := s.credentialVariableNames()
	ps, err := cfg.Params(func(name string) bool { return creds[name] })
	if err != nil {
		return nil, fmt.Errorf("template: %s: %w", err.Error(), kite.ErrInvalidParams)
	}
	return ps, nil
}

// paramsError maps Resolve's refusals to invalid params, keeping tmpl's message (parameter
// "NAME": MESSAGE, which the UI shows next to the field).
func paramsError(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", err.Error(), kite.ErrInvalidParams)
}

// resolvedParams are the values a stack keeps: public (Stack.Variables) and sensitive
// (Stack.SecretVariables), and the preset applied.
type resolvedParams struct {
	public, secret map[string]string
	preset         string
}

// all is every value, for a build.
func (r resolvedParams) all() map[string]string {
	out := maps.Clone(r.public)
	if out == nil {
		out = map[string]string{}
	}
	maps.Copy(out, r.secret)
	return out
}

// resolveParams checks p's parameters, variables and preset against files' parameters.
func (s *Server) resolveParams(files map[string][]byte, p *api.StackPlanParams) (resolvedParams, error) {
	cfg, err := tmpl.Parse(files)
	if err != nil {
		return resolvedParams{}, fmt.Errorf("template: %s: %w", err.Error(), kite.ErrInvalidParams)
	}
	ps, err := s.templateParams(cfg)
	if err != nil {
		return resolvedParams{}, err
	}
	vals, err := ps.Resolve(tmpl.Input{Values: p.Parameters, Strings: p.Variables, Preset: p.Preset})
	if err != nil {
		return resolvedParams{}, paramsError(err)
	}
	r := split(ps, vals)
	if pr := ps.Preset(""); p.Preset == nil && pr != nil {
		r.preset = pr.Name
	} else if p.Preset != nil {
		r.preset = *p.Preset
	}
	return r, nil
}

func split(ps *tmpl.Params, vals map[string]string) resolvedParams {
	r := resolvedParams{public: map[string]string{}, secret: map[string]string{}}
	for k, v := range vals {
		if pp, ok := ps.Param(k); ok && pp.Sensitive {
			r.secret[k] = v
		} else {
			r.public[k] = v
		}
	}
	return r
}

// updateParamValues checks stack.update's parameter changes for st, to the template revision whose
// files are files: each one a parameter, mutable (st is built), not sensitive (those are set
// when the stack is created), and all values together valid. It returns the stack's new public
// values.
func (s *Server) updateParamValues(st *model.Stack, files []model.File, changes map[string]json.RawMessage) (map[string]string, error) {
	cfg, err := tmpl.Parse(fileMap(files))
	if err != nil {
		return nil, fmt.Errorf("template: %s: %w", err.Error(), kite.ErrInvalidParams)
	}
	ps, err := s.templateParams(cfg)
	if err != nil {
		return nil, err
	}
	cur, err := s.flow().Variables(st, st.Variables)
	if err != nil {
		return nil, err
	}
	none := ""
	// The values the stack has now, each in its canonical form, to compare with.
	before, err := ps.Resolve(tmpl.Input{Strings: cur, Preset: &none})
	if err != nil {
		before = cur
	}
	next, err := ps.Resolve(tmpl.Input{Strings: cur, Values: changes, Preset: &none})
	if err != nil {
		return nil, paramsError(err)
	}
	var errs []error
	for name := range changes {
		pp, _ := ps.Param(name) // Resolve refused names that are no parameter
		old, had := before[name]
		if !had && pp.Default != nil {
			old = defaultString(pp.Default)
		}
		if next[name] == old {
			continue
		}
		switch {
		case !pp.Mutable:
			errs = append(errs, &tmpl.ParamError{Name: name, Message: fmt.Sprintf("parameter %s cannot change after the stack is built; create a new stack", name)})
		case pp.Sensitive:
			errs = append(errs, &tmpl.ParamError{Name: name, Message: "a sensitive parameter is set when the stack is created; create a new stack to change it"})
		}
	}
	if len(errs) > 0 {
		return nil, paramsError(errors.Join(errs...))
	}
	return split(ps, next).public, nil
}

// defaultString is a parameter's default (JSON) in -var form.
func defaultString(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	return string(raw)
}

// parameters serves template.parameters: the typed parameters and presets of a template
// revision (default: the current one).
func (a *templateAPI) parameters(ctx context.Context, c *Caller, r *kite.Request, p *api.TemplateGetParams) (api.TemplateParametersResult, error) {
	view, err := a.get(ctx, c, r, p)
	if err != nil {
		return api.TemplateParametersResult{}, err
	}
	cfg, err := tmpl.Parse(fileMap(view.Files))
	if err != nil {
		return api.TemplateParametersResult{}, fmt.Errorf("template: %s: %w", err.Error(), kite.ErrInvalidParams)
	}
	ps, err := a.srv.templateParams(cfg)
	if err != nil {
		return api.TemplateParametersResult{}, err
	}
	out := api.TemplateParametersResult{TemplateID: view.ID, Rev: view.Rev, Parameters: []api.TemplateParameter{}, Presets: []api.TemplatePreset{}}
	for _, pp := range ps.Parameters {
		out.Parameters = append(out.Parameters, pp.Parameter)
	}
	for _, pr := range ps.Presets {
		out.Presets = append(out.Presets, api.TemplatePreset{Name: pr.Name, Description: pr.Description, Default: pr.Default, Values: pr.Values})
	}
	return out, nil
}
