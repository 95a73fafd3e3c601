package kloud

import (
	"context"
	"errors"
	"fmt"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/kloud/store"
)

// AgentKitePrefix starts the kite id of every machine's agent key. A credential with such an id
// belongs to an agent (kitekey.IsAgent): it may register with kontrol but call no kloud method
// (a compromised machine must not act as its owner).
const AgentKitePrefix = kitekey.AgentIDPrefix

// Caller is the authenticated user of a call, with the teams they belong to.
type Caller struct {
	Username string
	Admin    bool              // kloud administrator: may see and do everything
	Teams    map[string]string // team slug → role
}

// Role returns the caller's role in team ("" if not a member; admins count as team admins).
func (c *Caller) Role(team string) string {
	if c.Admin {
		return RoleAdmin
	}
	return c.Teams[team]
}

// InTeam reports whether the caller may see the team's shared things.
func (c *Caller) InTeam(team string) bool { return c.Role(team) != "" }

// TeamAdmin reports whether the caller administers team.
func (c *Caller) TeamAdmin(team string) bool { return c.Role(team) == RoleAdmin }

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
	if kitekey.IsRestricted(p) { // a provider plugin acts for no user
		return nil, kitekey.PluginRefused(r)
	}
	return s.callerByName(ctx, p.Username, p.Admin)
}

func (s *Server) callerByName(ctx context.Context, username string, admin bool) (*Caller, error) {
	c := &Caller{Username: username, Admin: admin || username == Admin, Teams: map[string]string{}}
	u, err := s.store.Users().Get(ctx, username)
	switch {
	case err == nil:
		c.Admin = c.Admin || u.Admin
	case !errors.Is(err, store.ErrNotFound):
		return nil, err
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
