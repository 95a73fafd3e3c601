package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
)

// kloud login | logout | whoami. Login talks HTTP (POST /api/login) and keeps the session in
// <data-dir>/session, which --key (or KLOUD_KEY) then names for every other command.

// SessionFile is where `kloud login` keeps the session, in the data directory.
const SessionFile = "session"

func (g *globals) sessionPath() string { return filepath.Join(g.dataDir, SessionFile) }

// readPassword reads a password: from file ("-" is stdin) if given, else with a prompt and
// no echo when stdin is a terminal, else one line from stdin. confirm asks twice on a terminal.
func (g *globals) readPassword(file, prompt string, confirm bool) (string, error) {
	if file == "" && term.IsTerminal(int(os.Stdin.Fd())) {
		read := func(p string) (string, error) {
			fmt.Fprint(g.stderr, p)
			b, err := term.ReadPassword(int(os.Stdin.Fd()))
			fmt.Fprintln(g.stderr)
			return string(b), err
		}
		pw, err := read(prompt)
		if err != nil {
			return "", fmt.Errorf("read password: %w", err)
		}
		if confirm {
			again, err := read("Again: ")
			if err != nil {
				return "", fmt.Errorf("read password: %w", err)
			}
			if again != pw {
				return "", errors.New("the two passwords differ; try again")
			}
		}
		return pw, nil
	}
	var r io.Reader = os.Stdin
	if file != "" && file != "-" {
		f, err := os.Open(file)
		if err != nil {
			return "", fmt.Errorf("password file: %w", err)
		}
		defer f.Close()
		r = f
	}
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("read password: %w", err)
	}
	pw := strings.TrimRight(line, "\r\n")
	if pw == "" {
		return "", errors.New("no password given (stdin or --password-file was empty)")
	}
	return pw, nil
}

// postAPI posts JSON to kloud's HTTP API and decodes the answer; non-2xx answers become
// errors carrying the server's message.
func (g *globals) postAPI(ctx context.Context, path, bearer string, body, out any) (int, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, err
		}
		rd = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(g.url, "/")+path, rd)
	if err != nil {
		return 0, fmt.Errorf("kloud URL %q: %w", g.url, err)
	}
	req.Header.Set("Content-Type", "application/json")
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	hc, err := g.httpClient()
	if err != nil {
		return 0, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		if h := g.tlsHint(err); h != nil {
			return 0, h
		}
		return 0, fmt.Errorf("cannot reach kloud at %s: %w\n  is it running? start it with `kloud serve`, or point --url / KLOUD_URL at it", g.url, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode/100 != 2 {
		var e struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(raw, &e) != nil || e.Error == "" {
			e.Error = strings.TrimSpace(string(raw))
		}
		return resp.StatusCode, errors.New(e.Error)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return resp.StatusCode, fmt.Errorf("kloud at %s answered %s: not what this CLI expects (is it a kloud?)", g.url, resp.Status)
		}
	}
	return resp.StatusCode, nil
}

// writeSessionFile writes the session atomically with mode 0600.
func writeSessionFile(path, session string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("session file: %w", err)
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".session-*")
	if err != nil {
		return fmt.Errorf("session file: %w", err)
	}
	defer os.Remove(f.Name())
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return fmt.Errorf("session file: %w", err)
	}
	if _, err := f.WriteString(session + "\n"); err != nil {
		f.Close()
		return fmt.Errorf("session file: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("session file: %w", err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("session file: %w", err)
	}
	return nil
}

func loginCmd(g *globals) *cobra.Command {
	var username, pwFile, out string
	cmd := &cobra.Command{
		Use:   "login --username USER",
		Short: "Log in with a password and keep the session (12 h) for the other commands",
		Long: `Log in to kloud with your username and password. The password is read without echo
from the terminal (or one line from stdin, or --password-file). The session is written to
<data-dir>/session (mode 0600); use it with --key:

  kloud login --username alice
  export KLOUD_KEY=~/.kloud/session
  kloud whoami

Too many wrong passwords from one address lock the username there for a minute.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			pw, err := g.readPassword(pwFile, fmt.Sprintf("Password for %s at %s: ", username, g.url), false)
			if err != nil {
				return err
			}
			var res kloud.LoginResponse
			code, err := g.postAPI(cmd.Context(), "/api/login", "", kloud.LoginRequest{Username: username, Password: pw}, &res)
			switch {
			case code == http.StatusUnauthorized:
				return fmt.Errorf("%w\n  check the username and password; an administrator can reset it: kloud user passwd %s", err, username)
			case code == http.StatusTooManyRequests:
				return fmt.Errorf("%w\n  wait, then try again", err)
			case err != nil:
				return fmt.Errorf("login: %w", err)
			}
			path := out
			if path == "" {
				path = g.sessionPath()
			}
			if err := writeSessionFile(path, res.Session); err != nil {
				return err
			}
			if g.json {
				return g.printJSON(map[string]any{"username": res.Username, "admin": res.Admin, "expiresAt": res.ExpiresAt, "path": path})
			}
			fmt.Fprintf(g.stdout, "logged in to %s as %s until %s\nsession written to %s; use it with:\n  kloud --key %s <command>   (or export KLOUD_KEY=%s)\n",
				g.url, res.Username, res.ExpiresAt.Local().Format(time.DateTime), path, path, path)
			return nil
		},
	}
	cmd.Flags().StringVar(&username, "username", "", "your username (required)")
	cmd.Flags().StringVar(&pwFile, "password-file", "", "read the password from this file's first line (- for stdin)")
	cmd.Flags().StringVar(&out, "out", "", "write the session here instead of <data-dir>/session")
	cmd.MarkFlagRequired("username")
	return cmd
}

func logoutCmd(g *globals) *cobra.Command {
	var file string
	cmd := &cobra.Command{
		Use:   "logout",
		Short: "Revoke the session `kloud login` wrote and delete its file",
		Long: `Revoke the session on the server (connections using it are closed) and delete the session
file (default <data-dir>/session).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			path := file
			if path == "" {
				path = g.sessionPath()
			}
			b, err := os.ReadFile(path)
			if errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("not logged in: no session at %s (pass --session-file if it is elsewhere)", path)
			}
			if err != nil {
				return fmt.Errorf("session file: %w", err)
			}
			var res struct {
				LoggedOut bool `json:"loggedOut"`
			}
			if _, err := g.postAPI(cmd.Context(), "/api/logout", strings.TrimSpace(string(b)), nil, &res); err != nil {
				return fmt.Errorf("logout: %w\n  the session file %s was kept; delete it by hand to just forget the session", err, path)
			}
			if err := os.Remove(path); err != nil {
				return fmt.Errorf("session was revoked, but: %w", err)
			}
			if g.json {
				return g.printJSON(map[string]any{"revoked": res.LoggedOut, "removed": path})
			}
			if res.LoggedOut {
				fmt.Fprintf(g.stdout, "logged out; removed %s\n", path)
			} else {
				fmt.Fprintf(g.stdout, "the session had already expired or was revoked; removed %s\n", path)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&file, "session-file", "", "session file to revoke (default <data-dir>/session)")
	return cmd
}

func whoamiCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "whoami",
		Short: "Show who the key or session authenticates as, and your teams",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.dial(cmd.Context())
			if err != nil {
				return err
			}
			defer c.Close(nil)
			res, err := api.NewClient(c).UserWhoami(cmd.Context())
			if err != nil {
				return explain(err)
			}
			if g.json {
				return g.printJSON(res)
			}
			role := ""
			switch {
			case res.Admin:
				role = " (owner: kloud administrator)"
			case res.Role != "" && res.Role != model.RoleUser:
				role = " (" + res.Role + ")"
			}
			fmt.Fprintf(g.stdout, "%s%s, authenticated with a %s\n", res.Username, role, res.AuthType)
			if len(res.Teams) == 0 {
				fmt.Fprintln(g.stdout, "in no team: create one with `kloud team create SLUG`, or ask a team admin to add you")
				return nil
			}
			tw := newTable(g.stdout, "TEAM", "TITLE", "ROLE")
			for _, t := range res.Teams {
				tw.row(t.Slug, t.Title, t.Role)
			}
			return tw.flush()
		},
	}
}
