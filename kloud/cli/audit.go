package cli

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kloud-dev/kloud/kloud/api"
)

// The audit log: kloud audit [filters], kloud audit verify (audit.list, audit.verify;
// kloud/audit.go).

// auditCmd is `kloud audit` and `kloud audit verify`.
func auditCmd(g *globals) *cobra.Command {
	var p api.AuditListParams
	var since string
	cmd := &cobra.Command{
		Use:   "audit [--user U] [--since DURATION|TIME] [--target ID] [--action METHOD] [--limit N]",
		Short: "Show the audit log: who changed what, logins, terminals, port forwards (kloud administrators)",
		Long: `Show the audit log, newest first: every call that changes something (user, team,
credential, template, stack, machine, quota, job, ...), every web login (also failed ones),
every terminal, port-forward and web-app connection, with who, from where, what, which thing,
how it ended (ok, or error with its code) and when. Entries are hash-chained in the store:
'kloud audit verify' checks that none was edited, removed or reordered.

--since takes a duration back from now (90m, 24h, 7d) or a time (2026-11-29, or RFC 3339
2026-11-29T08:00:00Z). --target takes a target as shown (machine/ID, stack/ID, user/NAME) or
just the id.`,
		Example: `  kloud audit --since 24h
  kloud audit --user alice --action stack.apply
  kloud audit --target 0f3c... --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if since != "" {
				t, err := parseSince(since, time.Now())
				if err != nil {
					return fmt.Errorf("--since: %w", err)
				}
				p.Since = t
			}
			res, err := call(cmd.Context(), g, (*api.Client).AuditList, p)
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(res)
			}
			t := newTable(g.stdout, "SEQ", "TIME", "USER", "FROM", "ACTION", "TARGET", "RESULT", "DETAIL")
			for _, e := range res.Entries {
				result := e.Result
				if e.Code != 0 {
					result += " " + strconv.FormatInt(e.Code, 10)
				}
				var detail []string
				if e.DurationMs > 0 || e.Bytes > 0 {
					detail = append(detail, (time.Duration(e.DurationMs) * time.Millisecond).String(), strconv.FormatInt(e.Bytes, 10)+" bytes")
				}
				t.row(strconv.FormatInt(e.Seq, 10), e.Time.Local().Format("2006-01-02 15:04:05"), e.User, e.Remote, e.Action, e.Target, result, strings.Join(detail, ", "))
			}
			if err := t.flush(); err != nil {
				return err
			}
			if len(res.Entries) == 0 {
				fmt.Fprintln(g.stderr, "no entries")
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&p.User, "user", "", "only this user's entries")
	fl.StringVar(&since, "since", "", "only entries since a duration ago (24h, 7d) or a time (2026-11-29, RFC 3339)")
	fl.StringVar(&p.Target, "target", "", "only entries about this thing (machine/ID, stack/ID, user/NAME, or the bare id)")
	fl.StringVar(&p.Action, "action", "", "only this action (a method such as stack.apply, or web.login, terminal.open, ...)")
	fl.IntVar(&p.Limit, "limit", 100, fmt.Sprintf("at most this many entries (1-%d)", api.AuditMaxLimit))

	verify := &cobra.Command{
		Use:   "verify",
		Short: "Check the audit log's hash chain: ok, or the first entry edited, removed or reordered",
		Long: `Walk the audit log's hash chain in the store, from the start (or from where retention
pruned it). It says ok with the newest entry's seq and hash (keep them elsewhere: a later verify
whose chain no longer passes through them shows a rewrite), or names the first entry that was
edited, removed or reordered, and exits with status 1.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v, err := call0(cmd.Context(), g, (*api.Client).AuditVerify)
			if err != nil {
				return err
			}
			if g.json {
				if err := g.printJSON(v); err != nil {
					return err
				}
			} else if v.OK {
				from := "the start"
				if v.From > 0 {
					from = fmt.Sprintf("entry %d (older entries were pruned by retention)", v.From+1)
				}
				fmt.Fprintf(g.stdout, "ok: %d entries verified from %s; head %d %s\n", v.Checked, from, v.Head, v.HeadHash)
			}
			if !v.OK {
				return fmt.Errorf("the audit log was tampered with at entry %d: %s", v.BadSeq, v.Problem)
			}
			return nil
		},
	}
	cmd.AddCommand(verify)
	return cmd
}

// parseSince reads --since: a duration back from now (Go's units, and d for days), a date, or
// an RFC 3339 time.
func parseSince(s string, now time.Time) (time.Time, error) {
	if n, ok := strings.CutSuffix(s, "d"); ok {
		if days, err := strconv.Atoi(n); err == nil && days >= 0 {
			return now.AddDate(0, 0, -days), nil
		}
	}
	if d, err := time.ParseDuration(s); err == nil {
		if d < 0 {
			return time.Time{}, errors.New("a duration back from now is positive (24h)")
		}
		return now.Add(-d), nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	if t, err := time.ParseInLocation(time.DateOnly, s, time.Local); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("%q is neither a duration (90m, 24h, 7d) nor a time (2026-11-29, 2026-11-29T08:00:00Z)", s)
}

// daysFlag is a duration flag that also takes days (365d): kloud serve --audit-retention.
type daysFlag struct{ d *time.Duration }

func (f daysFlag) String() string {
	if f.d == nil {
		return ""
	}
	if *f.d > 0 && *f.d%(24*time.Hour) == 0 {
		return strconv.FormatInt(int64(*f.d/(24*time.Hour)), 10) + "d"
	}
	return f.d.String()
}

func (f daysFlag) Set(s string) error {
	var d time.Duration
	if n, ok := strings.CutSuffix(s, "d"); ok {
		days, err := strconv.Atoi(n)
		if err != nil {
			return fmt.Errorf("%q: want days (365d) or a duration (720h)", s)
		}
		d = time.Duration(days) * 24 * time.Hour
	} else {
		var err error
		if d, err = time.ParseDuration(s); err != nil {
			return fmt.Errorf("%q: want days (365d) or a duration (720h)", s)
		}
	}
	if d <= 0 {
		return fmt.Errorf("%q: want a positive duration", s)
	}
	*f.d = d
	return nil
}

func (f daysFlag) Type() string { return "DURATION" }
