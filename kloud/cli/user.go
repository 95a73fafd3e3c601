package cli

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
)

// kloud user add|list|passwd and kloud team create|list|add-member|remove-member.

// call dials kloud, makes one typed call (a method of api.Client, e.g. (*api.Client).StackList)
// and closes the connection; errors get a hint.
func call[P, R any](ctx context.Context, g *globals, m func(*api.Client, context.Context, P) (R, error), p P) (R, error) {
	var r R
	err := g.withConn(ctx, func(c *kite.Conn) error {
		var err error
		r, err = m(api.NewClient(c), ctx, p)
		return explain(err)
	})
	return r, err
}

// call0 is call for methods without params.
func call0[R any](ctx context.Context, g *globals, m func(*api.Client, context.Context) (R, error)) (R, error) {
	return call(ctx, g, func(c *api.Client, ctx context.Context, _ struct{}) (R, error) { return m(c, ctx) }, struct{}{})
}

func teamsString(m map[string]string) string {
	var s []string
	for t, r := range m {
		s = append(s, t+" ("+r+")")
	}
	sort.Strings(s)
	return strings.Join(s, ", ")
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func userCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "user", Short: "Manage users (adding them is for kloud administrators)"}

	var p api.UserAddParams
	var askPassword bool
	var pwFile string
	add := &cobra.Command{
		Use:   "add USERNAME",
		Short: "Add a user (kloud administrators only)",
		Long: `Add a user. Usernames are 2-32 characters of a-z, 0-9 and '-', starting with a letter
(admin, kloud and kontrol are reserved). With --password (prompted, no echo) or --password-file the
user can log in (kloud login, or the web UI); without, they can only use kite keys you create for
them (kloud key create). --team adds them to a team at once.

  kloud user add alice --password --team red
  kloud user add bob --email bob@example.com --password-file pw.txt --team red --role admin`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p.Username = args[0]
			if askPassword || pwFile != "" {
				pw, err := g.readPassword(pwFile, fmt.Sprintf("Password for %s: ", p.Username), true)
				if err != nil {
					return err
				}
				p.Password = pw
			}
			res, err := call(cmd.Context(), g, (*api.Client).UserAdd, p)
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(res)
			}
			fmt.Fprintf(g.stdout, "added user %s", res.Username)
			if len(res.Teams) > 0 {
				fmt.Fprintf(g.stdout, " to %s", teamsString(res.Teams))
			}
			fmt.Fprintln(g.stdout)
			if res.HasPassword {
				fmt.Fprintf(g.stdout, "they log in with: kloud login --username %s\n", res.Username)
			} else {
				fmt.Fprintf(g.stdout, "no password set: give them a key (kloud key create --username %s --out FILE) or set one (kloud user passwd %s)\n", res.Username, res.Username)
			}
			return nil
		},
	}
	f := add.Flags()
	f.StringVar(&p.Email, "email", "", "email address")
	f.BoolVar(&p.Admin, "admin", false, "make the user a kloud administrator")
	f.StringVar(&p.Team, "team", "", "add the user to this team")
	f.StringVar(&p.Role, "role", "", "role in --team: member (default) or admin")
	f.BoolVar(&askPassword, "password", false, "prompt for a password (no echo)")
	f.StringVar(&pwFile, "password-file", "", "read the password from this file's first line (- for stdin)")

	list := &cobra.Command{
		Use:   "list",
		Short: "List users (all for administrators; the members of your teams otherwise)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			res, err := call0(cmd.Context(), g, (*api.Client).UserList)
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(res.Users)
			}
			tw := newTable(g.stdout, "USERNAME", "ROLE", "EMAIL", "PASSWORD", "SSO", "TEAMS", "CREATED")
			for _, u := range res.Users {
				created := ""
				if !u.CreatedAt.IsZero() {
					created = u.CreatedAt.Local().Format(time.DateTime)
				}
				role := u.Role
				if role == "" {
					role = kloud.EffectiveRole(&u.User)
				}
				tw.row(u.Username, role, u.Email, yesNo(u.HasPassword), u.SSOIssuer, teamsString(u.Teams), created)
			}
			return tw.flush()
		},
	}

	var passwdFile string
	passwd := &cobra.Command{
		Use:   "passwd [USERNAME]",
		Short: "Set your password (or, as an administrator, anyone's)",
		Long: `Set a password: your own without USERNAME; an administrator may name any user, including
admin itself (so the administrator can log in to the web UI).`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var sp api.SetPasswordParams
			if len(args) == 1 {
				sp.Username = args[0]
			}
			who := sp.Username
			if who == "" {
				who = "yourself"
			}
			pw, err := g.readPassword(passwdFile, fmt.Sprintf("New password for %s: ", who), true)
			if err != nil {
				return err
			}
			sp.Password = pw
			res, err := call(cmd.Context(), g, (*api.Client).UserSetPassword, sp)
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(res)
			}
			fmt.Fprintf(g.stdout, "password of %v set\n", res.Username)
			return nil
		},
	}
	passwd.Flags().StringVar(&passwdFile, "password-file", "", "read the password from this file's first line (- for stdin)")

	role := &cobra.Command{
		Use:   "role USERNAME ROLE",
		Short: "Set a user's kloud-wide role (owners only)",
		Long: `Set a user's kloud-wide role, one of:

  owner           a kloud administrator: may do everything (user add --admin makes one)
  template-admin  a member who also trusts and untrusts templates of every team and sets their
                  machine caps (kloud template trust|untrust, template update --max-machines)
  auditor         reads everything an owner can read (lists, describes, jobs, quotas) and
                  changes nothing: every other call is refused
  member          any other user (the default)

Only owners set roles; the built-in admin is always an owner. The change applies to the user's
open sessions and keys at once. Team roles (team admin, member) are another thing: kloud team
add-member --role.

  kloud user role carol auditor
  kloud user role dave template-admin`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			res, err := call(cmd.Context(), g, (*api.Client).UserSetRole, api.SetRoleParams{Username: args[0], Role: args[1]})
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(res)
			}
			fmt.Fprintf(g.stdout, "%s is now %s\n", res.Username, res.Role)
			return nil
		},
	}

	cmd.AddCommand(add, list, passwd, role)
	return cmd
}

func teamCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "team",
		Short: "Manage teams: members share credentials and templates",
		Long: `Teams group users. A team's members see and use its credentials and templates; its admins
add and remove members and manage everything in it. Whoever creates a team is its first admin.`,
	}

	var title string
	create := &cobra.Command{
		Use:   "create SLUG",
		Short: "Create a team with you as its admin",
		Long:  "Create a team. SLUG is 2-32 characters of a-z, 0-9 and '-', starting with a letter.\n\n  kloud team create red --title \"Red team\"",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			res, err := call(cmd.Context(), g, (*api.Client).TeamCreate, api.TeamCreateParams{Slug: args[0], Title: title})
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(res)
			}
			fmt.Fprintf(g.stdout, "created team %s (%s); add members with: kloud team add-member %s USERNAME\n", res.Slug, res.Title, res.Slug)
			return nil
		},
	}
	create.Flags().StringVar(&title, "title", "", "title shown to people (default: the slug)")

	list := &cobra.Command{
		Use:   "list",
		Short: "List your teams (all teams for kloud administrators)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			res, err := call0(cmd.Context(), g, (*api.Client).TeamList)
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(res.Teams)
			}
			tw := newTable(g.stdout, "TEAM", "TITLE", "YOUR ROLE", "MEMBERS")
			for _, t := range res.Teams {
				var ms []string
				for _, m := range t.Members {
					if m.Role == model.RoleAdmin {
						ms = append(ms, m.Username+" (admin)")
					} else {
						ms = append(ms, m.Username)
					}
				}
				tw.row(t.Slug, t.Title, t.Role, strings.Join(ms, ", "))
			}
			return tw.flush()
		},
	}

	var role string
	addMember := &cobra.Command{
		Use:   "add-member TEAM USERNAME",
		Short: "Add a user to a team, or change their role (team admins)",
		Long:  "Add a user to a team, or change the role of a member.\n\n  kloud team add-member red bob\n  kloud team add-member red bob --role admin",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.memberCall(cmd.Context(), (*api.Client).TeamAddMember, api.TeamMemberParams{Team: args[0], Username: args[1], Role: role},
				fmt.Sprintf("%s is now %s of team %s", args[1], roleOr(role), args[0]))
		},
	}
	addMember.Flags().StringVar(&role, "role", model.RoleMember, "member or admin")

	removeMember := &cobra.Command{
		Use:   "remove-member TEAM USERNAME",
		Short: "Remove a user from a team (team admins; anyone may remove themself)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.memberCall(cmd.Context(), (*api.Client).TeamRemoveMember, api.TeamMemberParams{Team: args[0], Username: args[1]},
				fmt.Sprintf("removed %s from team %s", args[1], args[0]))
		},
	}
	cmd.AddCommand(create, list, addMember, removeMember)
	return cmd
}

func roleOr(r string) string {
	if r == model.RoleAdmin {
		return "an admin"
	}
	return "a member"
}

func (g *globals) memberCall(ctx context.Context, m func(*api.Client, context.Context, api.TeamMemberParams) (model.Team, error), p api.TeamMemberParams, done string) error {
	res, err := call(ctx, g, m, p)
	if err != nil {
		if errors.Is(err, kite.ErrState) {
			return fmt.Errorf("%w\n  a team needs an admin: make another member admin first (kloud team add-member %s USER --role admin)", err, p.Team)
		}
		return err
	}
	if g.json {
		return g.printJSON(res)
	}
	fmt.Fprintln(g.stdout, done)
	return nil
}
