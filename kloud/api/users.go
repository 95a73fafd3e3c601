package api

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/model"
)

// NoParams is the params type of methods that take none.
type NoParams struct{}

// VersionResult is the result of kloud.version.
type VersionResult struct {
	Version string `json:"version"`
}

// nameRE is what usernames and team slugs look like.
var nameRE = regexp.MustCompile(`^[a-z][a-z0-9-]{1,31}$`)

// ReservedUsernames are taken by kloud itself.
func ReservedUsernames() []string { return []string{"admin", "kloud", "kontrol", "kloud-pool"} }

// Password rules.
const (
	MinPasswordLen = 8
	MaxPasswordLen = 1024 // bounds the work of hashing what a client sends
)

// CheckName checks a username or team slug.
func CheckName(kind, name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("%s %q: must be 2-32 characters of a-z, 0-9 and '-', starting with a letter", kind, name)
	}
	return nil
}

// CheckRole checks a team role.
func CheckRole(role string) error {
	if role != model.RoleAdmin && role != model.RoleMember {
		return fmt.Errorf("role %q: must be %q or %q", role, model.RoleAdmin, model.RoleMember)
	}
	return nil
}

// CheckPassword checks a new password's length. Its errors are about content, not a malformed
// request: they wrap kite.ErrInvalidParams (Request.Bind keeps it; no "see --help").
func CheckPassword(pw string) error {
	switch {
	case len(pw) < MinPasswordLen:
		return fmt.Errorf("password: at least %d characters: %w", MinPasswordLen, kite.ErrInvalidParams)
	case len(pw) > MaxPasswordLen:
		return fmt.Errorf("password: at most %d bytes: %w", MaxPasswordLen, kite.ErrInvalidParams)
	}
	return nil
}

// UserAddParams are the params of user.add.
type UserAddParams struct {
	Username string `json:"username"`
	Password string `json:"password,omitempty"` // empty: the user logs in with kite keys only
	Email    string `json:"email,omitempty"`
	Admin    bool   `json:"admin,omitempty"`
	Team     string `json:"team,omitempty"` // a team to add the user to
	Role     string `json:"role,omitempty"` // role in Team (default member)
}

// Validate implements kite.Validator.
func (p *UserAddParams) Validate() error {
	if err := CheckName("username", p.Username); err != nil {
		return err
	}
	for _, r := range ReservedUsernames() {
		if p.Username == r {
			return fmt.Errorf("username %q is reserved", p.Username)
		}
	}
	if p.Password != "" {
		if err := CheckPassword(p.Password); err != nil {
			return err
		}
	}
	if p.Email != "" && (len(p.Email) > 254 || !strings.Contains(p.Email, "@") || strings.ContainsAny(p.Email, " \t\r\n")) {
		return fmt.Errorf("email %q does not look like an address", p.Email)
	}
	if p.Team == "" && p.Role != "" {
		return errors.New("role needs a team")
	}
	if p.Team != "" {
		if err := CheckName("team", p.Team); err != nil {
			return err
		}
		if p.Role == "" {
			p.Role = model.RoleMember
		}
		return CheckRole(p.Role)
	}
	return nil
}

// UserView is a user as user.add and user.list return it.
type UserView struct {
	model.User
	HasPassword bool              `json:"hasPassword"`
	Teams       map[string]string `json:"teams"` // slug → role
}

// UserListResult is the result of user.list.
type UserListResult struct {
	Users []UserView `json:"users"`
}

// TeamRole is one team of the caller.
type TeamRole struct {
	Slug  string `json:"slug"`
	Title string `json:"title"`
	Role  string `json:"role"`
}

// WhoamiResult is the result of user.whoami.
type WhoamiResult struct {
	Username string     `json:"username"`
	Admin    bool       `json:"admin"`
	Role     string     `json:"role"` // kloud-wide: owner, template-admin, auditor or member
	Email    string     `json:"email,omitempty"`
	AuthType string     `json:"authType"`
	Teams    []TeamRole `json:"teams"`
}

// Roles lists the kloud-wide roles a user may have (model.RoleOwner, …), most powerful first.
func Roles() []string {
	return []string{model.RoleOwner, model.RoleTemplateAdmin, model.RoleAuditor, model.RoleUser}
}

// SetRoleParams are the params of user.setRole.
type SetRoleParams struct {
	Username string `json:"username"`
	Role     string `json:"role"` // one of Roles()
}

// Validate implements kite.Validator.
func (p *SetRoleParams) Validate() error {
	if err := CheckName("username", p.Username); err != nil {
		return err
	}
	if !slices.Contains(Roles(), p.Role) {
		return fmt.Errorf("role %q: must be one of %s", p.Role, strings.Join(Roles(), ", "))
	}
	return nil
}

// SetPasswordParams are the params of user.setPassword.
type SetPasswordParams struct {
	Username string `json:"username,omitempty"` // default: the caller
	Password string `json:"password"`
}

// Validate implements kite.Validator.
func (p *SetPasswordParams) Validate() error { return CheckPassword(p.Password) }

// SetPasswordResult is the result of user.setPassword.
type SetPasswordResult struct {
	Username    string `json:"username"`
	PasswordSet bool   `json:"passwordSet"`
}

// TeamCreateParams are the params of team.create.
type TeamCreateParams struct {
	Slug  string `json:"slug"`
	Title string `json:"title,omitempty"` // default: the slug
}

// Validate implements kite.Validator.
func (p *TeamCreateParams) Validate() error {
	if err := CheckName("team", p.Slug); err != nil {
		return err
	}
	p.Title = strings.TrimSpace(p.Title)
	if p.Title == "" {
		p.Title = p.Slug
	}
	if len(p.Title) > 100 {
		return errors.New("title: at most 100 bytes")
	}
	return nil
}

// TeamView is a team as team.list returns it, with the caller's role.
type TeamView struct {
	model.Team
	Role string `json:"role,omitempty"`
}

// TeamListResult is the result of team.list.
type TeamListResult struct {
	Teams []TeamView `json:"teams"`
}

// TeamMemberParams are the params of team.addMember and team.removeMember.
type TeamMemberParams struct {
	Team     string `json:"team"`
	Username string `json:"username"`
	Role     string `json:"role,omitempty"` // addMember: admin or member (default member)
}

// Validate implements kite.Validator.
func (p *TeamMemberParams) Validate() error {
	if p.Team == "" || p.Username == "" {
		return errors.New("team and username are required")
	}
	if p.Role != "" {
		return CheckRole(p.Role)
	}
	return nil
}
