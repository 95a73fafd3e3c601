package kloud

import (
	"context"
	"errors"
	"fmt"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store"
)

// AgentKitePrefix starts the kite id of every machine's agent key. A credential with such an id
// belongs to an agent (kitekey.IsAgent): it may register with kontrol but call no kloud method
// (a compromised machine must not act as its owner).
const AgentKitePrefix = kitekey.AgentIDPrefix

// Caller is the authenticated user of a call, with the teams they belong to.
type Caller struct {
	Username string
	// Admin: may see and do everything in this call: an owner (a kloud administrator), or an
	// auditor in a read-only call (routes.go, authorize).
	Admin bool
	// KloudRole is the user's kloud-wide role (RoleOwner, RoleTemplateAdmin, RoleAuditor,
	// RoleUser); Role(team) is its role in a team.
	KloudRole string
	Teams     map[string]string // team slug → role
}

// TemplateAdmin reports whether the caller administers templates: trusts and untrusts them and
// sets their machine caps (owners and template admins).
func (c *Caller) TemplateAdmin() bool { return c.Admin || c.KloudRole == model.RoleTemplateAdmin }

// EffectiveRole is a user's kloud-wide role: its Role, where a user of the admin flag (made
// before roles, or with user add --admin) is an owner and a user without one a member.
func EffectiveRole(u *model.User) string {
	switch {
	case u.Admin || u.Role == model.RoleOwner || u.Username == Admin:
		return model.RoleOwner
	case u.Role == "":
		return model.RoleUser
	}
	return u.Role
}

// Role returns the caller's role in team ("" if not a member; admins count as team admins).
func (c *Caller) Role(team string) string {
	if c.Admin {
		return model.RoleAdmin
	}
	return c.Teams[team]
}

// InTeam reports whether the caller may see the team's shared things.
func (c *Caller) InTeam(team string) bool { return c.Role(team) != "" }

// TeamAdmin reports whether the caller administers team.
func (c *Caller) TeamAdmin(team string) bool { return c.Role(team) == model.RoleAdmin }

// CanManage reports whether the caller may change or delete something owned by owner in team:
// its owner, a team admin, or a kloud admin.
func (c *Caller) CanManage(owner, team string) bool {
	return c.Username == owner || c.TeamAdmin(team)
}

// TeamNames returns the caller's teams.
func (c *Caller) TeamNames() []string {
	out := make([]string, 0, len(c.Teams))
	for t := range c.Teams {
		out = append(out, t)
	}
	return out
}

// caller resolves who is calling.
func (s *Server) caller(ctx context.Context, r *kite.Request) (*Caller, error) {
	p := r.Principal()
	if p == nil {
		return nil, fmt.Errorf("%s: not authenticated: %w", r.Method, kite.ErrAuth)
	}
	if kitekey.IsAgent(p) {
		return nil, kitekey.AgentRefused(r)
	}
	if kitekey.IsReplica(p) { // another kloud replica acts for no user (mesh.go)
		return nil, kitekey.ReplicaRefused(r)
	}
	if kitekey.IsRestricted(p) { // a provider plugin acts for no user
		return nil, kitekey.PluginRefused(r)
	}
	return s.callerByName(ctx, p.Username, p.Admin)
}

// callerByName resolves username's role and teams. A user with a document has the role it
// records, whatever its credential says (a session issued while it was an owner stops being an
// owner's when its role changes); one without (the admin before its password is set, kite keys
// of names without a user) is an owner if the credential says admin.
func (s *Server) callerByName(ctx context.Context, username string, admin bool) (*Caller, error) {
	c := &Caller{Username: username, Admin: admin || username == Admin, KloudRole: model.RoleUser, Teams: map[string]string{}}
	u, err := s.store.Users().Get(ctx, username)
	switch {
	case err == nil:
		c.KloudRole = EffectiveRole(&u)
		c.Admin = c.KloudRole == model.RoleOwner
	case !errors.Is(err, store.ErrNotFound):
		return nil, err
	case c.Admin:
		c.KloudRole = model.RoleOwner
	}
	if username == model.PoolOwner {
		// The pools' stacks (pools.go) are built in their teams' names: their templates and
		// credentials are a member's to use. Nobody logs in as it (a reserved name with no key
		// of its own; the agent keys of pool machines register agents only).
		all, err := s.store.Teams().List(ctx)
		if err != nil {
			return nil, fmt.Errorf("load teams: %w", err)
		}
		for _, t := range all {
			c.Teams[t.Slug] = model.RoleMember
		}
		return c, nil
	}
	teams, err := s.store.Teams().OfMember(ctx, username)
	if err != nil {
		return nil, fmt.Errorf("load teams of %s: %w", username, err)
	}
	for _, t := range teams {
		for _, m := range t.Members {
			if m.Username == username {
				c.Teams[t.Slug] = m.Role
			}
		}
	}
	return c, nil
}

// notFound hides whether a document exists from callers who may not see it.
func notFound(kind, id string) error {
	return fmt.Errorf("%s %q: %w", kind, id, kite.ErrNotFound)
}
