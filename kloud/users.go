package kloud

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/argon2"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store"
)

// Users and teams: user.add (kloud admins), user.list, user.whoami, user.setPassword,
// team.create, team.list, team.addMember, team.removeMember. Passwords are hashed with argon2id
// (login is kloud/login). Team membership changes are compare-and-swap updates of the
// team's members array: the embedded store has neither positional updates nor $elemMatch, and
// a conditional update on the array as read is atomic on both backends.

// argon2id parameters for new hashes (OWASP's recommendation: 19 MiB, 2 passes, 1 lane). They
// are stored in each hash, so raising them later keeps old hashes working.
const (
	argonMemory  = 19 * 1024 // KiB
	argonTime    = 2
	argonThreads = 1
	argonKeyLen  = 32
	argonSaltLen = 16
)

// hashPassword returns a PHC-style string: $argon2id$v=19$m=19456,t=2,p=1$<salt>$<hash>.
func hashPassword(pw string) (string, error) {
	salt := make([]byte, argonSaltLen)
	if _, err := rand.Read(salt); err != nil {
		return "", fmt.Errorf("hash password: %w", err)
	}
	key := argon2.IDKey([]byte(pw), salt, argonTime, argonMemory, argonThreads, argonKeyLen)
	b64 := base64.RawStdEncoding
	return fmt.Sprintf("$argon2id$v=%d$m=%d,t=%d,p=%d$%s$%s", argon2.Version, argonMemory, argonTime, argonThreads,
		b64.EncodeToString(salt), b64.EncodeToString(key)), nil
}

// checkPasswordHash reports whether pw matches hash (constant-time comparison). A malformed
// hash never matches.
func checkPasswordHash(hash, pw string) bool {
	parts := strings.Split(hash, "$")
	if len(parts) != 6 || parts[1] != "argon2id" {
		return false
	}
	var v int
	var m, t uint32
	var p uint8
	if _, err := fmt.Sscanf(parts[2], "v=%d", &v); err != nil || v != argon2.Version {
		return false
	}
	if _, err := fmt.Sscanf(parts[3], "m=%d,t=%d,p=%d", &m, &t, &p); err != nil {
		return false
	}
	// Refuse parameters no hash of ours has, so a tampered record cannot make login hang.
	if m == 0 || m > 1<<20 || t == 0 || t > 16 || p == 0 || p > 16 {
		return false
	}
	b64 := base64.RawStdEncoding
	salt, err := b64.DecodeString(parts[4])
	if err != nil || len(salt) < 8 {
		return false
	}
	want, err := b64.DecodeString(parts[5])
	if err != nil || len(want) < 16 || len(want) > 64 {
		return false
	}
	got := argon2.IDKey([]byte(pw), salt, t, m, p, uint32(len(want)))
	return subtle.ConstantTimeCompare(got, want) == 1
}

// dummyHash is checked against when a login names an unknown user, so both cases take as long.
// It is computed on first use (argon2 costs 75 ms and 20 MB: not for every CLI command).
var dummyHash = sync.OnceValue(func() string {
	h, err := hashPassword("kloud dummy password for unknown users")
	if err != nil {
		panic(err)
	}
	return h
})

func (s *Server) loadUser(ctx context.Context, username string) (*model.User, error) {
	u, err := s.store.Users().Get(ctx, username)
	if errors.Is(err, store.ErrNotFound) {
		return nil, notFound("user", username)
	}
	if err != nil {
		return nil, err
	}
	return &u, nil
}

func (s *Server) loadTeam(ctx context.Context, slug string) (*model.Team, error) {
	t, err := s.store.Teams().Get(ctx, slug)
	if errors.Is(err, store.ErrNotFound) {
		return nil, notFound("team", slug)
	}
	if err != nil {
		return nil, err
	}
	return &t, nil
}

// userExists reports whether username may be named in a team: a user document or the admin.
func (s *Server) userExists(ctx context.Context, username string) (bool, error) {
	if username == Admin {
		return true, nil
	}
	return s.store.Users().Exists(ctx, username)
}

// userAPI serves user.* and team.* (routes.go): kloud's users, their passwords and kloud-wide
// roles, and teams with their members. It holds the users and teams repositories and reaches
// the lookups other areas share through dir (the Server).
type userAPI struct {
	users *store.Users
	teams *store.Teams
	now   func() time.Time // the store's clock (store.Store.Now)
	log   *slog.Logger
	dir   userDirectory
}

// userDirectory is what userAPI uses of the Server: the lookups and the membership change that
// other areas use too (web_api_login.go, credentials.go). *Server implements it.
type userDirectory interface {
	loadUser(ctx context.Context, username string) (*model.User, error)
	loadTeam(ctx context.Context, slug string) (*model.Team, error)
	userExists(ctx context.Context, username string) (bool, error)
	setMember(ctx context.Context, team, username, role string) error
}

// add (user.add) adds a user, and makes it a member of a team if asked (kloud admins).
func (a *userAPI) add(ctx context.Context, c *Caller, _ *kite.Request, p *api.UserAddParams) (api.UserView, error) {
	if !c.Admin {
		return api.UserView{}, fmt.Errorf("user.add is for kloud administrators: %w", kite.ErrPermission)
	}
	if p.Team != "" {
		if _, err := a.dir.loadTeam(ctx, p.Team); err != nil {
			return api.UserView{}, err
		}
	}
	u := model.User{Username: p.Username, Email: p.Email, Admin: p.Admin, CreatedAt: a.now()}
	if p.Admin {
		u.Role = model.RoleOwner
	}
	if p.Password != "" {
		h, err := hashPassword(p.Password)
		if err != nil {
			return api.UserView{}, err
		}
		u.PasswordHash = h
	}
	if err := a.users.Insert(ctx, u); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return api.UserView{}, fmt.Errorf("user %q already exists: %w", p.Username, kite.ErrConflict)
		}
		return api.UserView{}, fmt.Errorf("add user %s: %w", p.Username, err)
	}
	a.log.InfoContext(ctx, "user added", "user", p.Username, "admin", p.Admin, "by", c.Username)
	teams := map[string]string{}
	if p.Team != "" {
		if err := a.dir.setMember(ctx, p.Team, p.Username, p.Role); err != nil {
			return api.UserView{}, fmt.Errorf("user %s was added, but not to team %s: %w", p.Username, p.Team, err)
		}
		teams[p.Team] = p.Role
	}
	return api.UserView{User: u, HasPassword: u.PasswordHash != "", Teams: teams}, nil
}

// visibleTeams returns the caller's teams (every team for kloud admins).
func (a *userAPI) visibleTeams(ctx context.Context, c *Caller) ([]model.Team, error) {
	var teams []model.Team
	var err error
	if c.Admin {
		teams, err = a.teams.List(ctx)
	} else {
		teams, err = a.teams.Named(ctx, c.TeamNames())
	}
	if err != nil {
		return nil, fmt.Errorf("list teams: %w", err)
	}
	return teams, nil
}

// list (user.list) lists every user to kloud admins, and the members of their teams to others.
func (a *userAPI) list(ctx context.Context, c *Caller, _ *kite.Request, _ *api.NoParams) (api.UserListResult, error) {
	teams, err := a.visibleTeams(ctx, c)
	if err != nil {
		return api.UserListResult{}, err
	}
	roles := map[string]map[string]string{} // username → team → role
	for _, t := range teams {
		for _, m := range t.Members {
			if roles[m.Username] == nil {
				roles[m.Username] = map[string]string{}
			}
			roles[m.Username][t.Slug] = m.Role
		}
	}
	var users []model.User
	if c.Admin {
		users, err = a.users.List(ctx)
	} else {
		names := []string{c.Username}
		for n := range roles {
			names = append(names, n)
		}
		users, err = a.users.Named(ctx, names)
	}
	if err != nil {
		return api.UserListResult{}, fmt.Errorf("list users: %w", err)
	}
	out := api.UserListResult{Users: []api.UserView{}}
	seen := map[string]bool{}
	for _, u := range users {
		seen[u.Username] = true
		v := api.UserView{User: u, HasPassword: u.PasswordHash != "", Teams: roles[u.Username]}
		v.Role = EffectiveRole(&u) // an admin made before roles is an owner
		v.Admin = v.Role == model.RoleOwner
		if !c.Admin {
			v.Email = "" // addresses are for administrators
		}
		if v.Teams == nil {
			v.Teams = map[string]string{}
		}
		out.Users = append(out.Users, v)
	}
	// Members known only by kite key (the admin) have no user document.
	for name, r := range roles {
		if !seen[name] {
			u := model.User{Username: name, Admin: name == Admin}
			u.Role = EffectiveRole(&u)
			out.Users = append(out.Users, api.UserView{User: u, Teams: r})
		}
	}
	sort.Slice(out.Users, func(i, j int) bool { return out.Users[i].Username < out.Users[j].Username })
	return out, nil
}

// whoami (user.whoami) says who the caller is: role, teams, how it authenticated.
func (a *userAPI) whoami(ctx context.Context, c *Caller, r *kite.Request, _ *api.NoParams) (api.WhoamiResult, error) {
	out := api.WhoamiResult{Username: c.Username, Admin: c.KloudRole == model.RoleOwner, Role: c.KloudRole, Teams: []api.TeamRole{}}
	if p := r.Principal(); p != nil {
		out.AuthType = p.Type
	}
	if u, err := a.dir.loadUser(ctx, c.Username); err == nil {
		out.Email = u.Email
	}
	for slug, role := range c.Teams {
		tr := api.TeamRole{Slug: slug, Role: role}
		if t, err := a.dir.loadTeam(ctx, slug); err == nil {
			tr.Title = t.Title
		}
		out.Teams = append(out.Teams, tr)
	}
	sort.Slice(out.Teams, func(i, j int) bool { return out.Teams[i].Slug < out.Teams[j].Slug })
	return out, nil
}

// setPassword (user.setPassword) sets a user's password: their own, or anyone's for a kloud admin. Setting the
// admin's password creates its user document, so the admin can log in in a browser.
func (a *userAPI) setPassword(ctx context.Context, c *Caller, _ *kite.Request, p *api.SetPasswordParams) (api.SetPasswordResult, error) {
	if p.Username == "" {
		p.Username = c.Username
	}
	if p.Username != c.Username && !c.Admin {
		return api.SetPasswordResult{}, fmt.Errorf("only kloud administrators set other users' passwords: %w", kite.ErrPermission)
	}
	h, err := hashPassword(p.Password)
	if err != nil {
		return api.SetPasswordResult{}, err
	}
	if err := a.users.SetPassword(ctx, p.Username, h, p.Username == Admin); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return api.SetPasswordResult{}, notFound("user", p.Username)
		}
		return api.SetPasswordResult{}, err
	}
	a.log.InfoContext(ctx, "password set", "user", p.Username, "by", c.Username)
	return api.SetPasswordResult{Username: p.Username, PasswordSet: true}, nil
}

// setRole (user.setRole) sets a user's kloud-wide role (owners only, checked by the route). The built-in
// admin stays an owner; setting the role of a name without a user document is "not found".
func (a *userAPI) setRole(ctx context.Context, c *Caller, _ *kite.Request, p *api.SetRoleParams) (api.UserView, error) {
	if p.Username == Admin {
		return api.UserView{}, fmt.Errorf("%s is kloud's built-in administrator and always an owner: %w", Admin, kite.ErrInvalidParams)
	}
	if err := a.users.SetRole(ctx, p.Username, p.Role, false); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return api.UserView{}, fmt.Errorf("user %q: %w (add it first: kloud user add %s)", p.Username, kite.ErrNotFound, p.Username)
		}
		return api.UserView{}, err
	}
	a.log.Warn("role set", "user", p.Username, "role", p.Role, "by", c.Username)
	u, err := a.dir.loadUser(ctx, p.Username)
	if err != nil {
		return api.UserView{}, err
	}
	u.Role = EffectiveRole(u)
	return api.UserView{User: *u, HasPassword: u.PasswordHash != "", Teams: map[string]string{}}, nil
}

// teamCreate (team.create) creates a team with the caller as its admin.
func (a *userAPI) teamCreate(ctx context.Context, c *Caller, _ *kite.Request, p *api.TeamCreateParams) (model.Team, error) {
	t := model.Team{Slug: p.Slug, Title: p.Title, Members: []model.Member{{Username: c.Username, Role: model.RoleAdmin}}, CreatedAt: a.now()}
	if err := a.teams.Insert(ctx, t); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return model.Team{}, fmt.Errorf("team %q already exists: %w", p.Slug, kite.ErrConflict)
		}
		return model.Team{}, fmt.Errorf("create team %s: %w", p.Slug, err)
	}
	a.log.InfoContext(ctx, "team created", "team", p.Slug, "by", c.Username)
	return t, nil
}

// teamList (team.list) lists the caller's teams (every team for kloud admins).
func (a *userAPI) teamList(ctx context.Context, c *Caller, _ *kite.Request, _ *api.NoParams) (api.TeamListResult, error) {
	teams, err := a.visibleTeams(ctx, c)
	if err != nil {
		return api.TeamListResult{}, err
	}
	out := api.TeamListResult{Teams: []api.TeamView{}}
	for _, t := range teams {
		out.Teams = append(out.Teams, api.TeamView{Team: t, Role: c.Teams[t.Slug]})
	}
	sort.Slice(out.Teams, func(i, j int) bool { return out.Teams[i].Slug < out.Teams[j].Slug })
	return out, nil
}

// teamAddMember (team.addMember) adds a user to a team, or changes their role (team admins).
func (a *userAPI) teamAddMember(ctx context.Context, c *Caller, _ *kite.Request, p *api.TeamMemberParams) (model.Team, error) {
	if p.Role == "" {
		p.Role = model.RoleMember
	}
	if err := a.teamAdminCheck(ctx, c, p.Team); err != nil {
		return model.Team{}, err
	}
	ok, err := a.dir.userExists(ctx, p.Username)
	if err != nil {
		return model.Team{}, err
	}
	if !ok {
		return model.Team{}, fmt.Errorf("user %q: %w (add it first: kloud user add %s)", p.Username, kite.ErrNotFound, p.Username)
	}
	if err := a.dir.setMember(ctx, p.Team, p.Username, p.Role); err != nil {
		return model.Team{}, err
	}
	a.log.InfoContext(ctx, "team member set", "team", p.Team, "user", p.Username, "role", p.Role, "by", c.Username)
	return deref(a.dir.loadTeam(ctx, p.Team))
}

// teamRemoveMember (team.removeMember) removes a user from a team (team admins; anyone may leave a team).
func (a *userAPI) teamRemoveMember(ctx context.Context, c *Caller, _ *kite.Request, p *api.TeamMemberParams) (model.Team, error) {
	if p.Username != c.Username || !c.InTeam(p.Team) {
		if err := a.teamAdminCheck(ctx, c, p.Team); err != nil {
			return model.Team{}, err
		}
	}
	if err := a.dir.setMember(ctx, p.Team, p.Username, ""); err != nil {
		return model.Team{}, err
	}
	a.log.InfoContext(ctx, "team member removed", "team", p.Team, "user", p.Username, "by", c.Username)
	return deref(a.dir.loadTeam(ctx, p.Team))
}

// teamAdminCheck fails unless c administers team; a team the caller is not in is "not found".
func (a *userAPI) teamAdminCheck(ctx context.Context, c *Caller, team string) error {
	if !c.InTeam(team) {
		return notFound("team", team)
	}
	if !c.TeamAdmin(team) {
		return fmt.Errorf("team %q: only its admins manage members: %w", team, kite.ErrPermission)
	}
	if _, err := a.dir.loadTeam(ctx, team); err != nil {
		return err
	}
	return nil
}

// setMember sets username's role in team ("" removes them), refusing to leave the team without
// an admin. It is a compare-and-swap on the members array, retried a few times under contention.
func (s *Server) setMember(ctx context.Context, team, username, role string) error {
	for range 10 {
		t, err := s.loadTeam(ctx, team)
		if err != nil {
			return err
		}
		members := slices.Clone(t.Members)
		i := slices.IndexFunc(members, func(m model.Member) bool { return m.Username == username })
		switch {
		case role == "" && i < 0:
			return fmt.Errorf("user %q is not a member of team %q: %w", username, team, kite.ErrNotFound)
		case role == "":
			members = slices.Delete(members, i, i+1)
		case i < 0:
			members = append(members, model.Member{Username: username, Role: role})
		case members[i].Role == role:
			return nil
		default:
			members[i].Role = role
		}
		if !slices.ContainsFunc(members, func(m model.Member) bool { return m.Role == model.RoleAdmin }) {
			return fmt.Errorf("team %q would have no admin left; make another member admin first: %w", team, kite.ErrState)
		}
		if members == nil {
			members = []model.Member{}
		}
		ok, err := s.store.Teams().SetMembers(ctx, team, t.Members, members)
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
	}
	return fmt.Errorf("team %q changed concurrently too often; try again: %w", team, kite.ErrConflict)
}
