package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kloud-dev/kloud/kloud"
)

func backupCmd(g *globals) *cobra.Command {
	var keys bool
	cmd := &cobra.Command{
		Use:   "backup FILE [--include-keys]",
		Short: "Write a consistent backup of a running kloud to FILE (kloud administrators)",
		Long: `Write a backup of the kloud at --url to FILE (a gzipped tar; FILE must not exist), while it
serves: the store is one consistent snapshot of the embedded database (every collection as it
was at one instant; kloud goes on serving and running jobs meanwhile), followed by the terraform
states of the terraformer kloud started. Credentials, signing keys and machines' agent
configurations are sealed in the store and stay so; the terraform states are sealed with the same
key. The archive is read back whole before it is kept: a cut or damaged one is an error.

--include-keys adds kloud's secret key (data dir secret.key, which opens everything sealed) and
the admin's and kloud's kite keys: keep such a file as you keep the data directory. Without it,
a restore needs the old secret.key (kloud restore --secret-key), and the admin key is made anew.

An external store (--mongo-url) is not backed up here: use mongodump --oplog.

  kloud backup /var/backups/kloud-$(date +%F).tgz --include-keys`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			file := args[0]
			if _, err := os.Stat(file); err == nil {
				return fmt.Errorf("%s exists: give a new file", file)
			} else if !errors.Is(err, fs.ErrNotExist) {
				return err
			}
			cred, err := g.credential()
			if err != nil {
				return err
			}
			hc, err := g.httpClient()
			if err != nil {
				return err
			}
			u := strings.TrimRight(g.url, "/") + "/api/admin/backup"
			if keys {
				u += "?keys=1"
			}
			req, err := http.NewRequestWithContext(cmd.Context(), http.MethodGet, u, nil)
			if err != nil {
				return fmt.Errorf("kloud URL %q: %w", g.url, err)
			}
			req.Header.Set("Authorization", "Bearer "+cred)
			resp, err := hc.Do(req)
			if err != nil {
				if h := g.tlsHint(err); h != nil {
					return h
				}
				return fmt.Errorf("cannot reach kloud at %s: %w\n  is it running? start it with `kloud serve`, or point --url / KLOUD_URL at it", g.url, err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("backup: %s: %s", resp.Status, httpErrorText(resp.Body))
			}
			tmp, err := os.CreateTemp(filepath.Dir(file), "."+filepath.Base(file)+".partial-")
			if err != nil {
				return err
			}
			defer os.Remove(tmp.Name()) // gone after the rename
			n, err := io.Copy(tmp, resp.Body)
			if err == nil {
				err = tmp.Sync()
			}
			if err != nil {
				tmp.Close()
				return fmt.Errorf("backup: reading it from kloud: %w", err)
			}
			if _, err := tmp.Seek(0, io.SeekStart); err != nil {
				tmp.Close()
				return err
			}
			m, err := kloud.CheckBackup(tmp)
			tmp.Close()
			if err != nil {
				return fmt.Errorf("backup from kloud is not whole (kloud logs why): %w", err)
			}
			if err := os.Rename(tmp.Name(), file); err != nil {
				return err
			}
			if g.json {
				return g.printJSON(map[string]any{"file": file, "bytes": n, "manifest": m})
			}
			fmt.Fprintf(g.stdout, "backup of %s written to %s (%d bytes, taken %s)\n", g.url, file, n, m.CreatedAt.Format("2006-01-02 15:04:05Z07:00"))
			if m.IncludesKeys {
				fmt.Fprintln(g.stdout, "it holds kloud's keys (secret key, admin and kloud kite keys): keep it as safe as the data directory")
			} else {
				fmt.Fprintln(g.stdout, "it holds no keys: a restore needs this kloud's secret.key (kloud restore FILE --data-dir DIR --secret-key OLD_DIR/secret.key)")
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&keys, "include-keys", false, "include kloud's secret key and the admin's and kloud's kite keys")
	return cmd
}

func restoreCmd(g *globals) *cobra.Command {
	var secretKey string
	cmd := &cobra.Command{
		Use:   "restore FILE --data-dir DIR [--secret-key FILE]",
		Short: "Restore a backup into an empty data directory (then run kloud serve --data-dir DIR)",
		Long: `Write the backup FILE (from kloud backup) into --data-dir DIR, which must be empty or not exist:
kloud restore never merges into or replaces a data directory. Then start kloud on it with the
same --addr / --public-url as before: the users, teams, templates, stacks and machines are those
of the backup; jobs that were running when it was taken are resumed as after a crash; machines'
agents (klient) reconnect by themselves, their kite keys are signed by the restored keys.

A backup taken without --include-keys needs the old kloud's secret key: --secret-key
OLD_DATA_DIR/secret.key (checked before anything is written). Without it the sealed
credentials, signing keys and terraform states cannot be opened, and nothing is restored. The
admin key (admin.key) of such a backup is made anew at the first start.

Provider plugins (<data dir>/plugins) are not in a backup: install them again.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !cmd.Flags().Changed("data-dir") && os.Getenv("KLOUD_DATA_DIR") == "" {
				return errors.New("say where to restore: --data-dir DIR (an empty or new directory)")
			}
			f, err := os.Open(args[0])
			if err != nil {
				return err
			}
			defer f.Close()
			res, err := kloud.Restore(f, g.dataDir, secretKey)
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(res)
			}
			fmt.Fprintf(g.stdout, "restored the backup of %s into %s (%d terraform files; keys from %s)\n",
				res.Manifest.CreatedAt.Format("2006-01-02 15:04:05Z07:00"), res.DataDir, res.TerraformerFiles, res.Keys)
			fmt.Fprintf(g.stdout, "start it: kloud serve --data-dir %s (with the --addr and --public-url it had)\n", res.DataDir)
			return nil
		},
	}
	cmd.Flags().StringVar(&secretKey, "secret-key", "", "the old kloud's secret.key, for a backup taken without --include-keys")
	return cmd
}

// httpErrorText is the "error" of a JSON error body, else the body's start.
func httpErrorText(r io.Reader) string {
	b, _ := io.ReadAll(io.LimitReader(r, 4<<10))
	var e struct{ Error string }
	if json.Unmarshal(b, &e) == nil && e.Error != "" {
		return e.Error
	}
	return strings.TrimSpace(string(b))
}
