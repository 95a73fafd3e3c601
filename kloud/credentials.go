package kloud

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/provider"
)

// Credentials: credential.add, update, list, describe, remove, authenticate, bootstrap, and
// provider.describe.
//
// A credential belongs to a team: its members may see its metadata and use it in stacks; its
// owner and the team's admins may update, remove and bootstrap it. Values are validated against
// the provider's JSON Schema and decoded by the provider (provider.Provider.DecodePart), in
// process or, for a plugin, in the plugin's. Callers outside the team get
// "not found". The value, decoded into the provider's credential type, is sealed (AES-GCM, aad
// "credentials/<id>"); only the non-secret fields are kept in the clear, for display. Secret
// values never appear in a response, an error or a log line: errors that come from providers
// (Valid, VerifyCredential, Terraform) are redacted before they are stored or returned.
//
// Other kloud code gets a credential through credentialFor (access check, opened value and
// bootstrap outputs) and turns it into Terraform variables with credentialVariables.

const bootstrapJobKind = "credential.bootstrap"

// credentialAPI serves credential.* (the bootstrap job too, credential_bootstrap.go) and
// provider.describe. It opens credentials for the rest of kloud through Server.credentialFor.
type credentialAPI struct {
	creds     *store.Credentials
	stacks    *store.Stacks // the stacks using a credential (remove)
	jobs      *store.Jobs   // a bootstrap's job (staleBootstrap)
	vault     credentialVault
	providers *provider.Registry
	log       *slog.Logger
	srv       credentialServer
}

// credentialVault is what the credential area uses of the store besides its repositories
// (*store.Store implements it): sealing and opening values, the store's clock, and Persist.
type credentialVault interface {
	Seal(plaintext, aad []byte) ([]byte, error)
	Open(ciphertext, aad []byte) ([]byte, error)
	Now() time.Time
	Persist(ctx context.Context, what string, timeout time.Duration, fn func(ctx context.Context) error) error
}

// credentialServer is what the credential area uses of Server (which implements it).
type credentialServer interface {
	loadTeam(ctx context.Context, slug string) (*model.Team, error)                              // users.go
	capable(name, method string, cap provider.Capability) error                                  // machines.go
	terraformer() (Terraformer, error)                                                           // server.go
	startJob(ctx context.Context, id string, spec jobSpec, target, owner string) (string, error) // jobs.go
}

func credentialAAD(id string) []byte { return []byte(store.CollCredentials + "/" + id) }
func bootstrapAAD(id string) []byte  { return []byte(store.CollCredentials + "/" + id + "/bootstrap") }

// load returns the credential document if c may see it (a member of its team).
func (a *credentialAPI) load(ctx context.Context, c *Caller, id string) (*model.Credential, error) {
	cr, err := a.creds.Get(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, notFound("credential", id)
	}
	if err != nil {
		return nil, err
	}
	if !c.InTeam(cr.Team) {
		return nil, notFound("credential", id)
	}
	return &cr, nil
}

// manageCheck fails unless c may change cr (its owner or a team admin).
func manageCheck(c *Caller, cr *model.Credential, what string) error {
	if !c.CanManage(cr.Owner, cr.Team) {
		return fmt.Errorf("credential %s: only its owner (%s) or an admin of team %s may %s it: %w", cr.ID, cr.Owner, cr.Team, what, kite.ErrPermission)
	}
	return nil
}

// openValue decodes a sealed credential or bootstrap value into newFn's type (or a map).
func (a *credentialAPI) openValue(sealed, aad []byte, newFn func() any) (any, error) {
	plain, err := a.vault.Open(sealed, aad)
	if err != nil {
		return nil, err
	}
	var v any = &map[string]any{}
	if newFn != nil {
		v = newFn()
	}
	dec := json.NewDecoder(bytes.NewReader(plain))
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		return nil, fmt.Errorf("decode sealed value: %w", err)
	}
	if m, ok := v.(*map[string]any); ok {
		return *m, nil
	}
	return v, nil
}

// providerCredential opens cr for a provider: value, and bootstrap outputs if it has them.
func (a *credentialAPI) providerCredential(p *provider.Provider, cr *model.Credential) (*provider.Credential, error) {
	val, err := a.openValue(cr.Sealed, credentialAAD(cr.ID), p.Schema.NewCredential)
	if err != nil {
		return nil, fmt.Errorf("credential %s: %w", cr.ID, err)
	}
	pc := &provider.Credential{ID: cr.ID, Title: cr.Title, Provider: cr.Provider, Team: cr.Team, Value: val}
	if b := cr.Bootstrap; b != nil && b.Status == model.BootstrapDone && len(b.Sealed) > 0 {
		if pc.Bootstrap, err = a.openValue(b.Sealed, bootstrapAAD(cr.ID), p.Schema.NewBootstrap); err != nil {
			return nil, fmt.Errorf("credential %s bootstrap: %w", cr.ID, err)
		}
	}
	return pc, nil
}

// credentialFor returns credential id, opened, for use by c with provider providerName
// (empty: any): c must be in the credential's team. It also returns the names of the Terraform
// variables that carry secrets (see credentialVariables).
func (s *Server) credentialFor(ctx context.Context, c *Caller, id, providerName string) (*provider.Credential, []string, error) {
	return s.creds.credentialFor(ctx, c, id, providerName)
}

// credentialFor is Server.credentialFor.
func (a *credentialAPI) credentialFor(ctx context.Context, c *Caller, id, providerName string) (*provider.Credential, []string, error) {
	cr, err := a.load(ctx, c, id)
	if err != nil {
		return nil, nil, err
	}
	if providerName != "" && cr.Provider != providerName {
		return nil, nil, fmt.Errorf("credential %s is for provider %s, not %s: %w", id, cr.Provider, providerName, kite.ErrInvalidParams)
	}
	p, err := a.providers.Lookup(cr.Provider)
	if err != nil {
		return nil, nil, fmt.Errorf("credential %s: %s: %w", id, err.Error(), kite.ErrState)
	}
	pc, err := a.providerCredential(p, cr)
	if err != nil {
		return nil, nil, err
	}
	_, secret := credentialVariables(p, pc)
	return pc, secret, nil
}

// defaultTeam resolves an omitted team to the caller's only team.
func defaultTeam(c *Caller, team string) (string, error) {
	if team != "" {
		return team, nil
	}
	names := c.TeamNames()
	sort.Strings(names)
	switch len(names) {
	case 1:
		return names[0], nil
	case 0:
		return "", fmt.Errorf("you are in no team: create one (kloud team create SLUG) or ask a team admin to add you: %w", kite.ErrInvalidParams)
	}
	return "", fmt.Errorf("you are in several teams (%s): say which with team: %w", strings.Join(names, ", "), kite.ErrInvalidParams)
}

func (a *credentialAPI) add(ctx context.Context, c *Caller, _ *kite.Request, p *api.CredentialAddParams) (api.CredentialAddResult, error) {
	team, err := defaultTeam(c, p.Team)
	if err != nil {
		return api.CredentialAddResult{}, err
	}
	if !c.InTeam(team) {
		return api.CredentialAddResult{}, fmt.Errorf("team %q: you are not a member: %w", team, kite.ErrPermission)
	}
	if _, err := a.srv.loadTeam(ctx, team); err != nil {
		return api.CredentialAddResult{}, err
	}
	prov, err := a.providers.Lookup(p.Provider)
	if err != nil {
		return api.CredentialAddResult{}, fmt.Errorf("%s (providers: %s): %w", err.Error(), strings.Join(a.providers.Names(), ", "), kite.ErrInvalidParams)
	}
	if !prov.HasPart(provider.PartCredential) {
		return api.CredentialAddResult{}, fmt.Errorf("provider %s takes no credential: %w", p.Provider, kite.ErrInvalidParams)
	}
	// The secrets as sent, to keep them out of decoding errors.
	var raw map[string]any
	if len(p.Data) > 0 {
		if err := json.Unmarshal(p.Data, &raw); err != nil {
			return api.CredentialAddResult{}, fmt.Errorf("data must be a JSON object of the provider's fields: %w", kite.ErrInvalidParams)
		}
	}
	secretFields := partSecrets(prov, provider.PartCredential)
	red := redactor(secretValues(raw, secretFields))
	val, err := prov.DecodePart(ctx, provider.PartCredential, p.Data, nil)
	if err != nil {
		return api.CredentialAddResult{}, fmt.Errorf("%s credential: %s (see kloud provider describe %s): %w", p.Provider, red.String(err.Error()), p.Provider, kite.ErrInvalidParams)
	}
	plain, err := json.Marshal(val)
	if err != nil {
		return api.CredentialAddResult{}, fmt.Errorf("encode credential: %w", err)
	}
	id := store.NewID()
	sealed, err := a.vault.Seal(plain, credentialAAD(id))
	if err != nil {
		return api.CredentialAddResult{}, err
	}
	public, set := publicAndSet(val, secretFields)
	now := a.vault.Now()
	cr := model.Credential{ID: id, Provider: p.Provider, Title: p.Title, Team: team, Owner: c.Username, Sealed: sealed,
		Public: public, Secret: set, Bootstrap: &model.Bootstrap{Status: model.BootstrapNone, UpdatedAt: now}, CreatedAt: now, UpdatedAt: now}
	if err := a.creds.Insert(ctx, cr); err != nil {
		return api.CredentialAddResult{}, fmt.Errorf("add credential: %w", err)
	}
	a.log.InfoContext(ctx, "credential added", "credential", id, "provider", p.Provider, "team", team, "by", c.Username)
	return api.CredentialAddResult{ID: id}, nil
}

// partSecrets returns the names of the secret fields of p's part (writeOnly in its schema).
func partSecrets(p *provider.Provider, part string) map[string]bool {
	out := map[string]bool{}
	for _, f := range provider.SchemaFields(p.JSONSchema(part)) {
		if f.Secret {
			out[f.Name] = true
		}
	}
	return out
}

// publicAndSet splits a decoded credential value into what is kept in the clear (its non-secret
// fields) and the sorted names of the secret fields that have a value.
func publicAndSet(val any, secretFields map[string]bool) (map[string]any, []string) {
	public := map[string]any{}
	set := []string{}
	for name, v := range provider.JSONMap(val) {
		switch {
		case !secretFields[name]:
			public[name] = v
		case !isZeroJSON(v):
			set = append(set, name)
		}
	}
	sort.Strings(set)
	return public, set
}

// update changes fields of a credential's value (owner or team admin): the params are
// a merge patch over the stored value (fields left out keep their value, secrets included; null
// resets a field), decoded by the provider against the old value (immutable fields, the type's
// ValidUpdate), sealed and stored in one update that fails if the credential changed meanwhile.
// The provider's verdict is reset: authenticate it again.
func (a *credentialAPI) update(ctx context.Context, c *Caller, _ *kite.Request, p *api.CredentialUpdateParams) (api.CredentialUpdateResult, error) {
	cr, err := a.load(ctx, c, p.CredentialID)
	if err != nil {
		return api.CredentialUpdateResult{}, err
	}
	if err := manageCheck(c, cr, "update"); err != nil {
		return api.CredentialUpdateResult{}, err
	}
	if b := cr.Bootstrap; b != nil && (b.Status == model.BootstrapRunning || b.Status == model.BootstrapDestroying) {
		return api.CredentialUpdateResult{}, fmt.Errorf("credential %s: its bootstrap job %s is running; wait for it: %w", cr.ID, b.JobID, kite.ErrState)
	}
	prov, err := a.providers.Lookup(cr.Provider)
	if err != nil {
		return api.CredentialUpdateResult{}, fmt.Errorf("credential %s: %s: %w", cr.ID, err.Error(), kite.ErrState)
	}
	if !prov.HasPart(provider.PartCredential) {
		return api.CredentialUpdateResult{}, fmt.Errorf("provider %s takes no credential: %w", cr.Provider, kite.ErrInvalidParams)
	}
	oldPlain, err := a.vault.Open(cr.Sealed, credentialAAD(cr.ID))
	if err != nil {
		return api.CredentialUpdateResult{}, fmt.Errorf("credential %s: %w", cr.ID, err)
	}
	old := map[string]any{}
	dec := json.NewDecoder(bytes.NewReader(oldPlain))
	dec.UseNumber()
	if err := dec.Decode(&old); err != nil {
		return api.CredentialUpdateResult{}, fmt.Errorf("credential %s: decode sealed value: %w", cr.ID, err)
	}
	patch := map[string]any{}
	dec = json.NewDecoder(bytes.NewReader(p.Data))
	dec.UseNumber()
	if err := dec.Decode(&patch); err != nil {
		return api.CredentialUpdateResult{}, fmt.Errorf("data must be a JSON object of the fields to change: %w", kite.ErrInvalidParams)
	}
	secretFields := partSecrets(prov, provider.PartCredential)
	red := redactor(append(secretValues(patch, secretFields), secretValues(old, secretFields)...))
	merged := maps.Clone(old)
	for k, v := range patch {
		if v == nil {
			delete(merged, k)
		} else {
			merged[k] = v
		}
	}
	raw, err := json.Marshal(merged)
	if err != nil {
		return api.CredentialUpdateResult{}, fmt.Errorf("encode credential: %w", err)
	}
	val, err := prov.DecodePart(ctx, provider.PartCredential, raw, oldPlain)
	if err != nil {
		return api.CredentialUpdateResult{}, fmt.Errorf("%s credential %s: %s (see kloud provider describe %s): %w", cr.Provider, cr.ID, red.String(err.Error()), cr.Provider, kite.ErrInvalidParams)
	}
	plain, err := json.Marshal(val)
	if err != nil {
		return api.CredentialUpdateResult{}, fmt.Errorf("encode credential: %w", err)
	}
	sealed, err := a.vault.Seal(plain, credentialAAD(cr.ID))
	if err != nil {
		return api.CredentialUpdateResult{}, err
	}
	public, set := publicAndSet(val, secretFields)
	ok, err := a.creds.UpdateValue(ctx, cr.ID, cr.UpdatedAt, sealed, public, set)
	if err != nil {
		return api.CredentialUpdateResult{}, err
	}
	if !ok {
		return api.CredentialUpdateResult{}, fmt.Errorf("credential %s changed meanwhile (another update, or a bootstrap started); look again and retry: %w", cr.ID, kite.ErrConflict)
	}
	changed := []string{}
	newM := provider.JSONMap(val)
	for _, f := range provider.SchemaFields(prov.JSONSchema(provider.PartCredential)) {
		a, _ := json.Marshal(old[f.Name])
		b, _ := json.Marshal(newM[f.Name])
		if !bytes.Equal(a, b) {
			changed = append(changed, f.Name)
		}
	}
	sort.Strings(changed)
	a.log.InfoContext(ctx, "credential updated", "credential", cr.ID, "fields", changed, "by", c.Username)
	return api.CredentialUpdateResult{ID: cr.ID, Changed: changed}, nil
}

func isZeroJSON(v any) bool {
	switch x := v.(type) {
	case nil:
		return true
	case string:
		return x == ""
	case bool:
		return !x
	case json.Number:
		return x.String() == "0"
	}
	return false
}

// list lists the credentials of the caller's teams (every team's for kloud admins),
// metadata only.
func (a *credentialAPI) list(ctx context.Context, c *Caller, _ *kite.Request, p *api.CredentialListParams) (api.CredentialListResult, error) {
	f := store.CredentialFilter{Provider: p.Provider}
	switch {
	case p.Team != "":
		if !c.InTeam(p.Team) {
			return api.CredentialListResult{}, notFound("team", p.Team)
		}
		f.Teams = []string{p.Team}
	case c.Admin:
		f.AllTeams = true
	default:
		f.Teams = c.TeamNames()
	}
	list, err := a.creds.List(ctx, f)
	if err != nil {
		return api.CredentialListResult{}, fmt.Errorf("list credentials: %w", err)
	}
	out := api.CredentialListResult{Credentials: []model.Credential{}}
	for _, cr := range list {
		cr.Public = nil
		out.Credentials = append(out.Credentials, cr)
	}
	return out, nil
}

func (a *credentialAPI) describe(ctx context.Context, c *Caller, _ *kite.Request, p *api.CredentialRef) (api.CredentialView, error) {
	cr, err := a.load(ctx, c, p.CredentialID)
	if err != nil {
		return api.CredentialView{}, err
	}
	v := api.CredentialView{Credential: *cr, Fields: []api.CredentialField{}}
	if prov, err := a.providers.Lookup(cr.Provider); err == nil {
		for _, f := range provider.SchemaFields(prov.JSONSchema(provider.PartCredential)) {
			cf := api.CredentialField{Field: f}
			if f.Secret {
				cf.Set = slices.Contains(cr.Secret, f.Name)
			} else if val, ok := cr.Public[f.Name]; ok {
				cf.Value, cf.Set = val, !isZeroJSON(val)
			}
			v.Fields = append(v.Fields, cf)
		}
	}
	return v, nil
}

// remove deletes a credential (owner or team admin) that no live stack uses and
// whose bootstrap resources are gone.
func (a *credentialAPI) remove(ctx context.Context, c *Caller, _ *kite.Request, p *api.CredentialRef) (api.CredentialRemoveResult, error) {
	cr, err := a.load(ctx, c, p.CredentialID)
	if err != nil {
		return api.CredentialRemoveResult{}, err
	}
	if err := manageCheck(c, cr, "remove"); err != nil {
		return api.CredentialRemoveResult{}, err
	}
	if b := cr.Bootstrap; b != nil {
		switch b.Status {
		case model.BootstrapRunning, model.BootstrapDestroying:
			return api.CredentialRemoveResult{}, fmt.Errorf("credential %s: its bootstrap job %s is running; wait for it: %w", cr.ID, b.JobID, kite.ErrState)
		case model.BootstrapDone, model.BootstrapFailed:
			if len(b.ContentIDs) > 0 {
				return api.CredentialRemoveResult{}, fmt.Errorf("credential %s has bootstrap resources; remove them first with `kloud credential bootstrap %s --destroy`: %w", cr.ID, cr.ID, kite.ErrState)
			}
		}
	}
	stacks, err := a.stacks.UsingCredential(ctx, cr.Provider, cr.ID)
	if err != nil {
		return api.CredentialRemoveResult{}, fmt.Errorf("find stacks using credential %s: %w", cr.ID, err)
	}
	var live []string
	for _, st := range stacks {
		if st.State != "Destroyed" && st.State != "Terminated" {
			live = append(live, st.ID)
		}
	}
	if len(live) > 0 {
		return api.CredentialRemoveResult{}, fmt.Errorf("credential %s is used by stack(s) %s; destroy them first (kloud stack destroy ID): %w", cr.ID, strings.Join(live, ", "), kite.ErrState)
	}
	// Delete only what was checked: a bootstrap that started meanwhile keeps it.
	deleted, err := a.creds.DeleteIdle(ctx, cr.ID)
	if err != nil {
		return api.CredentialRemoveResult{}, err
	}
	if !deleted {
		return api.CredentialRemoveResult{}, fmt.Errorf("credential %s changed meanwhile (a bootstrap started?); look again: %w", cr.ID, kite.ErrConflict)
	}
	a.log.InfoContext(ctx, "credential removed", "credential", cr.ID, "by", c.Username)
	return api.CredentialRemoveResult{ID: cr.ID, Removed: true}, nil
}

// providerStack builds the provider's Stack for credential work (no stack involved).
func (a *credentialAPI) providerStack(p *provider.Provider, cr *model.Credential, owner string) (provider.Stack, error) {
	if p.Stack == nil {
		return nil, fmt.Errorf("provider %s has no stack operations: %w", p.Name, kite.ErrState)
	}
	st, err := p.Stack(&provider.BaseStack{Provider: p, Team: cr.Team, Owner: owner, Log: a.log.With("provider", p.Name, "credential", cr.ID)})
	if err != nil {
		return nil, fmt.Errorf("provider %s: %w", p.Name, err)
	}
	return st, nil
}

// authenticate asks the provider whether the credential works and records the answer.
func (a *credentialAPI) authenticate(ctx context.Context, c *Caller, _ *kite.Request, p *api.CredentialRef) (api.AuthenticateResult, error) {
	cr, err := a.load(ctx, c, p.CredentialID)
	if err != nil {
		return api.AuthenticateResult{}, err
	}
	prov, err := a.providers.Lookup(cr.Provider)
	if err != nil {
		return api.AuthenticateResult{}, fmt.Errorf("credential %s: %s: %w", cr.ID, err.Error(), kite.ErrState)
	}
	pc, err := a.providerCredential(prov, cr)
	if err != nil {
		return api.AuthenticateResult{}, err
	}
	red := redactor(secretValues(pc.Value, provider.SecretFields(pc.Value)))
	st, err := a.providerStack(prov, cr, c.Username)
	if err != nil {
		return api.AuthenticateResult{}, red.Err(err)
	}
	res := api.AuthenticateResult{ID: cr.ID, Verified: true}
	if verr := st.VerifyCredential(ctx, pc); verr != nil {
		res.Verified, res.Error = false, red.String(verr.Error())
		if res.Error == "" {
			res.Error = "rejected by the provider"
		}
	}
	if err := a.creds.SetVerified(ctx, cr.ID, res.Verified, res.Error); err != nil {
		return api.AuthenticateResult{}, fmt.Errorf("record verification of credential %s: %w", cr.ID, err)
	}
	a.log.InfoContext(ctx, "credential verified", "credential", cr.ID, "verified", res.Verified, "by", c.Username)
	return res, nil
}

func (a *credentialAPI) providerDescribe(ctx context.Context, c *Caller, _ *kite.Request, p *api.ProviderDescribeParams) (api.ProviderDescribeResult, error) {
	out := api.ProviderDescribeResult{Providers: []provider.Description{}}
	for _, name := range a.providers.Names() {
		if p.Provider != "" && name != p.Provider {
			continue
		}
		prov, err := a.providers.Lookup(name)
		if err != nil {
			continue
		}
		out.Providers = append(out.Providers, provider.Describe(prov))
	}
	if p.Provider != "" && len(out.Providers) == 0 {
		return api.ProviderDescribeResult{}, fmt.Errorf("provider %q (providers: %s): %w", p.Provider, strings.Join(a.providers.Names(), ", "), kite.ErrNotFound)
	}
	return out, nil
}
