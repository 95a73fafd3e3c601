package login

// The kloud user of a single sign-on identity: bound to (issuer, subject), created at its first
// login with a free name, its teams following the groups claim (sso.go says the rules).

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store"
)

// ssoUser returns the user bound to the identity, creating it at its first login, and brings
// its team memberships in line with the groups claim.
func (s *Service) ssoUser(ctx context.Context, c ssoClaims) (*model.User, error) {
	ids := s.o.Store.Identities()
	var username string
	id, err := ids.Get(ctx, c.Issuer, c.Subject)
	switch {
	case err == nil:
		username = id.Username
	case errors.Is(err, store.ErrNotFound):
		if username, err = s.ssoCreate(ctx, c); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("look up identity: %w", err)
	}
	found, err := s.o.Store.Users().Get(ctx, username)
	if err != nil {
		return nil, ssoFail(http.StatusForbidden, fmt.Sprintf("the kloud user %q of this identity is gone; ask an administrator", username), err)
	}
	u := &found
	// A binding whose user was replaced (removed, and a local user of the name added) does not
	// sign in as the new one.
	if u.SSOIssuer != c.Issuer {
		return nil, ssoFail(http.StatusForbidden, fmt.Sprintf("the kloud user %q is not this identity's; ask an administrator", username), nil)
	}
	if err := s.ssoTeams(ctx, u, c.groups(s.sso.o.GroupsClaim)); err != nil {
		return nil, err
	}
	return u, nil
}

// ssoCreate creates the user of a first login and binds the identity to it. The binding is
// inserted first: of two concurrent first logins of one subject, one wins and the other uses
// its user.
func (s *Service) ssoCreate(ctx context.Context, c ssoClaims) (string, error) {
	ids := s.o.Store.Identities()
	email := c.str("email")
	if len(email) > 254 || !strings.Contains(email, "@") || strings.ContainsAny(email, " \t\r\n") {
		email = ""
	}
	for _, name := range ssoCandidates(c) {
		if slices.Contains(api.ReservedUsernames(), name) {
			continue
		}
		taken, err := s.o.Users.UserExists(ctx, name)
		if err != nil {
			return "", err
		}
		if taken {
			continue
		}
		err = ids.Insert(ctx, model.Identity{Issuer: c.Issuer, Subject: c.Subject, Username: name})
		if errors.Is(err, store.ErrConflict) { // a concurrent first login bound it
			id, err := ids.Get(ctx, c.Issuer, c.Subject)
			if err != nil {
				return "", fmt.Errorf("look up identity: %w", err)
			}
			return id.Username, nil
		}
		if err != nil {
			return "", fmt.Errorf("bind identity: %w", err)
		}
		err = s.o.Store.Users().Insert(ctx, model.User{Username: name, Email: email, SSOIssuer: c.Issuer, CreatedAt: s.o.Store.Now()})
		if errors.Is(err, store.ErrConflict) { // the name was taken meanwhile: never take it over
			if err := ids.Delete(ctx, c.Issuer, c.Subject, name); err != nil {
				return "", err
			}
			continue
		}
		if err != nil {
			ids.Delete(ctx, c.Issuer, c.Subject, name)
			return "", fmt.Errorf("add user %s: %w", name, err)
		}
		s.log.Info("user added", "user", name, "by", "sso", "issuer", c.Issuer, "subject", c.Subject)
		return name, nil
	}
	return "", ssoFail(http.StatusConflict, "no free kloud username for this identity; ask an administrator", nil)
}

// ssoCandidates are the usernames a first login tries, in order: preferred_username, the
// email's local part, then name-2 … name-9 of the first of them that is a valid name, and last
// "sso-" and 12 hex digits of sha256(issuer " " subject).
func ssoCandidates(c ssoClaims) []string {
	var base string
	for _, v := range []string{c.str("preferred_username"), c.str("email"), c.str("nickname")} {
		if n := ssoName(v); n != "" {
			base = n
			break
		}
	}
	var out []string
	if base != "" {
		out = append(out, base)
		for i := 2; i <= 9; i++ {
			b := base
			if len(b) > 30 {
				b = strings.TrimRight(b[:30], "-")
			}
			out = append(out, fmt.Sprintf("%s-%d", b, i))
		}
	}
	sum := sha256.Sum256([]byte(store.IdentityID(c.Issuer, c.Subject)))
	return append(out, "sso-"+hex.EncodeToString(sum[:6]))
}

// ssoName makes a kloud username of a claim: the part before "@", lower case, runs of other
// characters than a-z and 0-9 as one "-", at most 32 characters, starting with a letter; ""
// if nothing valid is left.
func ssoName(v string) string {
	v, _, _ = strings.Cut(strings.ToLower(strings.TrimSpace(v)), "@")
	var b strings.Builder
	dash := false
	for _, r := range v {
		switch {
		case r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			if b.Len() == 0 && r <= '9' {
				continue // must start with a letter
			}
			b.WriteRune(r)
			dash = false
		case b.Len() > 0 && !dash:
			b.WriteByte('-')
			dash = true
		}
	}
	n := strings.Trim(b.String(), "-")
	if len(n) > 32 {
		n = strings.TrimRight(n[:32], "-")
	}
	if api.CheckName("username", n) != nil {
		return ""
	}
	return n
}

// ssoTeams adds u to each team named by a group, and removes it from the teams single sign-on
// added it to whose group is gone. A membership made by hand is left alone, and so is a
// team admin's.
func (s *Service) ssoTeams(ctx context.Context, u *model.User, groups []string) error {
	want := map[string]bool{}
	for _, g := range groups {
		if api.CheckName("team", g) == nil {
			want[g] = true
		}
	}
	teams, err := s.o.Store.Teams().OfMember(ctx, u.Username)
	if err != nil {
		return fmt.Errorf("load teams of %s: %w", u.Username, err)
	}
	member := map[string]string{}
	for _, t := range teams {
		for _, m := range t.Members {
			if m.Username == u.Username {
				member[t.Slug] = m.Role
			}
		}
	}
	var managed []string
	for _, t := range u.SSOTeams {
		switch {
		case want[t]:
			managed = append(managed, t)
		case member[t] == model.RoleMember:
			if err := s.o.Users.SetMember(ctx, t, u.Username, ""); err != nil && !errors.Is(err, store.ErrNotFound) {
				s.log.Warn("sso: leave team", "user", u.Username, "team", t, "err", err)
				managed = append(managed, t)
				continue
			}
			s.log.Info("team member removed", "team", t, "user", u.Username, "by", "sso (group gone)")
		}
	}
	for g := range want {
		if member[g] != "" {
			continue // a member already (maybe by hand): leave the role alone
		}
		if _, err := s.o.Store.Teams().Get(ctx, g); err != nil {
			if !errors.Is(err, store.ErrNotFound) {
				return fmt.Errorf("load team %s: %w", g, err)
			}
			continue // a group that names no team
		}
		if err := s.o.Users.SetMember(ctx, g, u.Username, model.RoleMember); err != nil {
			return fmt.Errorf("add %s to team %s: %w", u.Username, g, err)
		}
		s.log.Info("team member set", "team", g, "user", u.Username, "role", model.RoleMember, "by", "sso (group)")
		managed = append(managed, g)
	}
	slices.Sort(managed)
	managed = slices.Compact(managed)
	if !slices.Equal(managed, u.SSOTeams) {
		if err := s.o.Store.Users().SetSSOTeams(ctx, u.Username, managed); err != nil {
			return err
		}
		u.SSOTeams = managed
	}
	return nil
}
