// Package cli is the kloud command line: `kloud serve` runs the server; every other command is
// a client that talks to a running kloud over the kite protocol.
//
// Start with Run. Client commands find kloud through --url / KLOUD_URL (default
// http://127.0.0.1:7000) and authenticate with --key / KLOUD_KEY (default: the admin key in
// --data-dir / KLOUD_DATA_DIR, default ~/.kloud).
package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/kloud-dev/kloud/internal/tlsconf"
	"github.com/kloud-dev/kloud/internal/version"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/kite/wsframe"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kontrol/kontrolapi"
)

// defaultURL is where client commands find kloud without --url / KLOUD_URL.
const defaultURL = "http://127.0.0.1:7000"

type globals struct {
	url, key, dataDir string
	// caCert: --ca-cert / KLOUD_CA_CERT, a CA to trust beside the system's (tlsConfig).
	caCert         string
	json           bool
	stdout, stderr io.Writer
}

// tlsConfig is what client commands trust for an https --url: the system's roots plus
// --ca-cert.
func (g *globals) tlsConfig() (*tls.Config, error) { return tlsconf.Client(g.caCert) }

// httpClient is an HTTP client trusting what tlsConfig trusts.
func (g *globals) httpClient() (*http.Client, error) {
	cfg, err := g.tlsConfig()
	if err != nil {
		return nil, err
	}
	return tlsconf.HTTPClient(cfg, 0), nil
}

// tlsHint explains a certificate kloud's client did not trust (nil for other errors).
func (g *globals) tlsHint(err error) error {
	var ua x509.UnknownAuthorityError
	var cv *tls.CertificateVerificationError
	var hn x509.HostnameError
	switch {
	case errors.As(err, &ua) || (errors.As(err, &cv) && strings.Contains(cv.Error(), "unknown authority")):
		return fmt.Errorf("kloud at %s: %w\n  its certificate is not signed by a CA this machine trusts: pass --ca-cert FILE (or set %s) with the CA that signed it", g.url, err, tlsconf.EnvCACert)
	case errors.As(err, &hn):
		return fmt.Errorf("kloud at %s: %w\n  the certificate names another host: use the URL it was issued for (--url / KLOUD_URL)", g.url, err)
	}
	return nil
}

// Run runs the kloud command with args (without the program name) and returns the exit code.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	g := &globals{stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:           "kloud",
		Short:         "Kloud turns Terraform stack templates into running machines with a browser terminal",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	pf := root.PersistentFlags()
	pf.StringVar(&g.url, "url", envOr("KLOUD_URL", defaultURL), "kloud URL (env KLOUD_URL)")
	pf.StringVar(&g.key, "key", os.Getenv("KLOUD_KEY"), "kite key or session file to authenticate with (env KLOUD_KEY; default: the admin key in --data-dir)")
	pf.StringVar(&g.dataDir, "data-dir", envOr("KLOUD_DATA_DIR", kloud.DefaultDataDir()), "kloud data directory (env KLOUD_DATA_DIR)")
	pf.BoolVar(&g.json, "json", false, "print JSON")
	pf.StringVar(&g.caCert, "ca-cert", os.Getenv(tlsconf.EnvCACert), "PEM file of a CA to trust beside the system's, for a kloud whose TLS certificate no public CA signed (env "+tlsconf.EnvCACert+"; kloud serve passes it to its terraformer, plugins and machines)")
	// The command tree: every command, and the file it lives in.
	root.AddCommand(
		serveCmd(g),                           // serve.go (+ serve_*.go: providers, demo)
		versionCmd(g), keyCmd(g), kitesCmd(g), // cli.go
		loginCmd(g), logoutCmd(g), whoamiCmd(g), // login.go
		userCmd(g), teamCmd(g), // user.go
		credentialCmd(g), providerCmd(g), // credential.go
		templateCmd(g), stackCmd(g), machineCmd(g), jobCmd(g), // stack.go (+ template_trust.go)
		sshCmd(g),                   // ssh.go
		configSSHCmd(g),             // sshstdio.go
		snapshotCmd(g),              // snapshot.go
		bucketCmd(g),                // bucket.go
		tfCmd(g),                    // tf.go
		portForwardCmd(g),           // portforward.go
		gcCmd(g),                    // gc.go
		quotaCmd(g),                 // quota.go
		poolCmd(g),                  // pool.go
		auditCmd(g),                 // audit.go
		backupCmd(g), restoreCmd(g), // backup.go
		doctorCmd(g), // doctor.go
		storeCmd(g),  // store.go
	)
	root.SetArgs(args)
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(stderr, "kloud:", err)
		return 1
	}
	return 0
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func versionCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version of this kloud binary and of the server (kloud.version)",
		Long: `Print the version of this kloud binary and of the kloud server at --url. When the server
cannot be asked (not running, no key), the client's version is printed and the reason goes to
stderr; the exit status is 0 either way.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := map[string]string{"client": version.Version}
			ctx, cancel := context.WithTimeout(cmd.Context(), 5*time.Second)
			defer cancel()
			sv, err := call0(ctx, g, (*api.Client).Version)
			if err == nil {
				out["server"] = sv.Version
			} else {
				out["serverError"] = err.Error()
			}
			if g.json {
				return g.printJSON(out)
			}
			fmt.Fprintln(g.stdout, "kloud", out["client"])
			if err != nil {
				fmt.Fprintf(g.stderr, "kloud: server version unknown: %v\n", err)
				return nil
			}
			fmt.Fprintln(g.stdout, "server", out["server"])
			return nil
		},
	}
}

func keyCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "key", Short: "Manage kite keys"}
	var username, prov, out, kiteID string
	create := &cobra.Command{
		Use:   "create (--username U --out FILE | --provider NAME [--out FILE])",
		Short: "Mint a kite key for a user, or a plugin key for a remote provider plugin (admin only)",
		Long: `Mint a key (kloud administrators only) and write it to --out (mode 0400).

--username U: a kite key for user U (--out is required).

--provider NAME: a plugin key for a remote provider plugin NAME, one kloud did not launch (e.g.
on a laptop next to its hypervisor): run the plugin with KLOUD_PLUGIN_URL=<kloud>/kite and
KLOUD_PLUGIN_KEY_FILE=FILE (or --url and --key-file). The key can do nothing but register and
serve provider NAME; it does not expire: revoke it by its kite id (kontrol.revoke). kloud logs
who created it. Without --out the key is printed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case (username == "") == (prov == ""):
				return errors.New("say whose key: --username U (a user's kite key) or --provider NAME (a remote plugin's key)")
			case prov != "":
				return createPluginKey(cmd.Context(), g, prov, kiteID, out)
			case out == "":
				return errors.New("--out FILE is required for a user's key")
			}
			c, err := g.dial(cmd.Context())
			if err != nil {
				return err
			}
			defer c.Close(nil)
			var res kontrolapi.CreateKeyResult
			if err := c.Call(cmd.Context(), kontrolapi.MethodCreateKey, &kontrolapi.CreateKeyParams{Username: username, KiteID: kiteID}, &res); err != nil {
				return explain(err)
			}
			if err := kitekey.WriteFile(out, res.Key); err != nil {
				return err
			}
			if g.json {
				return g.printJSON(map[string]string{"path": out, "kiteId": res.KiteID, "username": username})
			}
			fmt.Fprintf(g.stdout, "wrote kite key for %s (kite id %s) to %s\n", username, res.KiteID, out)
			return nil
		},
	}
	create.Flags().StringVar(&username, "username", "", "owner of a user's kite key")
	create.Flags().StringVar(&prov, "provider", "", "provider name of a remote plugin's key")
	create.Flags().StringVar(&out, "out", "", "file to write (required for --username; default for --provider: print the key)")
	create.Flags().StringVar(&kiteID, "kite-id", "", "kite id to put in the key (default: a new one)")
	cmd.AddCommand(create)
	return cmd
}

// writeSecret writes a key file of mode 0400 (through a temporary file and a rename).
func writeSecret(path, content string) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(f.Name()) // gone after the rename
	if _, err := f.WriteString(content); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Chmod(0o400); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// createPluginKey mints a remote plugin's key with provider.keyCreate.
func createPluginKey(ctx context.Context, g *globals, prov, kiteID, out string) error {
	res, err := call(ctx, g, (*api.Client).ProviderKeyCreate, api.ProviderKeyCreateParams{Provider: prov, KiteID: kiteID})
	if err != nil {
		return err
	}
	if out == "" {
		if g.json {
			return g.printJSON(res)
		}
		fmt.Fprintln(g.stdout, res.Key)
		return nil
	}
	if err := writeSecret(out, res.Key+"\n"); err != nil {
		return err
	}
	if g.json {
		return g.printJSON(map[string]string{"path": out, "kiteId": res.KiteID, "provider": prov})
	}
	fmt.Fprintf(g.stdout, "wrote plugin key for provider %s (kite id %s) to %s\n", prov, res.KiteID, out)
	return nil
}

func kitesCmd(g *globals) *cobra.Command {
	var q kite.Identity
	cmd := &cobra.Command{
		Use:   "kites",
		Short: "List the kites registered with kontrol (yours, or all for an admin)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.dial(cmd.Context())
			if err != nil {
				return err
			}
			defer c.Close(nil)
			var res kontrolapi.QueryResult
			if err := c.Call(cmd.Context(), kontrolapi.MethodQuery, &kontrolapi.QueryParams{Query: q}, &res); err != nil {
				return explain(err)
			}
			if g.json {
				// The --json shape of `kloud kites`: kite, url (also when empty), registeredAt.
				type kiteJSON struct {
					Kite         kite.Identity `json:"kite"`
					URL          string        `json:"url"`
					RegisteredAt time.Time     `json:"registeredAt"`
				}
				var out []kiteJSON // null when kontrol said null, as before
				for _, k := range res.Kites {
					out = append(out, kiteJSON{Kite: k.Kite, URL: k.URL, RegisteredAt: k.RegisteredAt})
				}
				if res.Kites != nil && out == nil {
					out = []kiteJSON{}
				}
				return g.printJSON(out)
			}
			tw := newTable(g.stdout, "ID", "USER", "NAME", "VERSION", "HOSTNAME", "REGISTERED")
			for _, k := range res.Kites {
				tw.row(k.Kite.ID, k.Kite.Username, k.Kite.Name, k.Kite.Version, k.Kite.Hostname, k.RegisteredAt.Local().Format(time.DateTime))
			}
			return tw.flush()
		},
	}
	f := cmd.Flags()
	f.StringVar(&q.Username, "username", "", "only kites of this user")
	f.StringVar(&q.Name, "name", "", "only kites with this name (e.g. klient)")
	f.StringVar(&q.ID, "id", "", "only the kite with this id")
	f.StringVar(&q.Hostname, "hostname", "", "only kites on this host")
	return cmd
}

func (g *globals) printJSON(v any) error {
	enc := json.NewEncoder(g.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// dial connects to kloud and authenticates with the key file.
func (g *globals) dial(ctx context.Context) (*kite.Conn, error) {
	keyPath := g.key
	if keyPath == "" {
		keyPath = filepath.Join(g.dataDir, kloud.AdminKeyFile)
	}
	key, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, fmt.Errorf("read key %s: %w\n  pass --key FILE (or KLOUD_KEY), or --data-dir of a kloud whose admin key you may use", keyPath, err)
	}
	auth := kite.Auth{Type: kite.AuthKiteKey, Key: strings.TrimSpace(string(key))}
	if c, err := kitekey.ParseUnverified(auth.Key); err != nil || c.Kind != kitekey.KindKiteKey {
		auth.Type = kite.AuthSession
	}
	tc, err := g.tlsConfig()
	if err != nil {
		return nil, err
	}
	// A refused call (-32007: a user's rate limit) waits the retry time kloud names and goes
	// again, for up to 30s in all: a script calling the CLI in a loop slows down, not fails.
	k, err := kite.New(kite.Options{Identity: kite.Identity{Name: "kloud-cli", Version: version.Version}, TLSConfig: tc, RateLimitedRetry: 30 * time.Second})
	if err != nil {
		return nil, err
	}
	u := strings.TrimRight(g.url, "/") + "/kite"
	c, err := k.Dial(ctx, u, auth)
	if err != nil {
		var oe *net.OpError
		var nu *wsframe.NotUpgradedError
		if h := g.tlsHint(err); h != nil {
			return nil, h
		}
		switch {
		case errors.As(err, &nu) && nu.Status == "400 Bad Request" && strings.HasPrefix(u, "http://"):
			return nil, fmt.Errorf("kloud at %s answered %s to %s: it may serve TLS (kloud serve --tls-cert)\n  use https://%s", g.url, nu.Status, u, strings.TrimPrefix(strings.TrimRight(g.url, "/"), "http://"))
		case errors.As(err, &nu):
			return nil, fmt.Errorf("nothing speaking kite answers at %s: %s answered %s to %s\n  point --url (or KLOUD_URL) at kloud: `kloud serve` prints its address (\"listening on HOST:PORT\"); the default is %s",
				g.url, whatAnswered(nu), nu.Status, u, defaultURL)
		case errors.As(err, &oe) || errors.Is(err, syscall.ECONNREFUSED):
			return nil, fmt.Errorf("cannot reach kloud at %s: %w\n  is it running? start it with `kloud serve`, or point --url / KLOUD_URL at it", g.url, err)
		case errors.Is(err, kite.ErrStoreUnavailable):
			return nil, fmt.Errorf("kloud at %s cannot reach its store: %w\n  %s", g.url, err, storeHint)
		case errors.Is(err, kite.ErrAuth):
			return nil, fmt.Errorf("kloud at %s rejected the key %s: %w\n  use --key with a key this kloud issued (`kloud key create`), or --data-dir of this kloud", g.url, keyPath, err)
		}
		return nil, fmt.Errorf("connect to kloud at %s: %w\n  is --url (or KLOUD_URL) kloud's address? `kloud serve` prints it (\"listening on HOST:PORT\")", g.url, err)
	}
	return c, nil
}

// whatAnswered describes the HTTP server of a failed kite dial from its headers.
func whatAnswered(nu *wsframe.NotUpgradedError) string {
	var what []string
	if nu.Server != "" {
		what = append(what, "Server: "+nu.Server)
	}
	if ct, _, _ := strings.Cut(nu.ContentType, ";"); ct != "" {
		what = append(what, ct)
	}
	if len(what) == 0 {
		return "an HTTP server"
	}
	return "an HTTP server (" + strings.Join(what, ", ") + ")"
}

// storeHint is what to do when kloud's store does not answer.
const storeHint = "kloud's database does not answer (kloud logs the cause; GET /readyz names what is not ready); try again once it is back"

// explain adds what to do next to common errors. Only a malformed request (kite.ErrInvalidField:
// a missing or ill-formed field, i.e. a flag or argument) points at --help; other invalid-params
// errors (a template's syntax, a password too short, a provider's rule) say themselves what is
// wrong with the content, and flags are not the problem.
func explain(err error) error {
	switch {
	case errors.Is(err, kite.ErrPermission):
		return fmt.Errorf("%w\n  this needs another user's rights (e.g. the admin key: --key ~/.kloud/admin.key)", err)
	case errors.Is(err, kite.ErrInvalidField):
		return fmt.Errorf("%w\n  see --help for the expected flags", err)
	case errors.Is(err, kite.ErrStoreUnavailable):
		return fmt.Errorf("%w\n  %s", err, storeHint)
	}
	return err
}
