package kloud

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/kloud-dev/kloud/internal/version"
	"github.com/kloud-dev/kloud/kloud/store"
)

// Backup and restore (docs/operations.md "Backup and restore"). GET /api/admin/backup (kloud
// administrators; `kloud backup FILE`) streams a gzipped tar of:
//
//	kloud-backup.json                  the manifest (BackupManifest), first
//	secret.key, admin.key, kloud.key   only with ?keys=1 (--include-keys)
//	db/kloud.sqlite                    the embedded store, one consistent snapshot (store.Snapshot)
//	terraformer/stacks/<id>/…          the terraform states and content of the terraformer kloud
//	                                   starts (<data dir>/terraformer), each file sealed
//
// Secrets stay sealed: credentials, signing keys and agent configurations are sealed in the
// store already and are copied as they are; the terraformer files (a state may hold what a
// provider put in attributes) are sealed here with the store's secret key. The secret key
// itself, and the admin's and kloud's kite keys, go in only with keys=1. Restore (`kloud restore
// FILE --data-dir DIR`) writes it all into an empty data directory.

// Names in a backup archive.
const (
	backupManifest = "kloud-backup.json"
	backupDB       = "db/"
	backupTF       = "terraformer/"
	// backupFormat is BackupManifest.Format of what this kloud writes and reads.
	backupFormat = 1
)

// backupKeyCheck is sealed into the manifest, so a restore can tell whether a secret key is
// the one the backup was sealed with before it writes anything.
const backupKeyCheck = "kloud backup key check"

// BackupManifest describes a backup (kloud-backup.json).
type BackupManifest struct {
	Format       int       `json:"format"`
	KloudVersion string    `json:"kloudVersion"`
	CreatedAt    time.Time `json:"createdAt"`
	// IncludesKeys: secret.key, admin.key and kloud.key are in the archive.
	IncludesKeys bool `json:"includesKeys"`
	// KeyCheck is backupKeyCheck sealed with the secret key.
	KeyCheck []byte `json:"keyCheck"`
}

// backupAPI serves GET /api/admin/backup (routes.go): the archive of the data directory's store,
// terraformer files and, if asked, keys. It holds the data directory, what it reads of the
// store, and the Server's HTTP authentication.
type backupAPI struct {
	dataDir string
	store   backupStore
	log     *slog.Logger
	// caller is Server.httpCaller (httpauth.go): who sends the request.
	caller func(r *http.Request) (*Caller, error)
}

// backupStore is what a backup uses of the store (*store.Store): a consistent copy of its
// database, and its clock.
type backupStore interface {
	Snapshot(ctx context.Context, dst string) error
	Now() time.Time
}

// serve serves GET /api/admin/backup.
func (b *backupAPI) serve(w http.ResponseWriter, r *http.Request) {
	c, err := b.caller(r)
	if err != nil {
		var he *httpError
		if errors.As(err, &he) {
			writeError(w, he.code, he.msg)
			return
		}
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	if !c.Admin {
		writeError(w, http.StatusForbidden, "backups are for kloud administrators")
		return
	}
	keys := r.URL.Query().Get("keys") == "1"
	secret, err := os.ReadFile(filepath.Join(b.dataDir, store.SecretKeyFile))
	if err != nil {
		writeError(w, http.StatusInternalServerError, "backup: the store's secret key: "+err.Error())
		return
	}
	tmp, err := os.MkdirTemp(b.dataDir, ".backup-")
	if err != nil {
		writeError(w, http.StatusInternalServerError, "backup: "+err.Error())
		return
	}
	defer os.RemoveAll(tmp)
	snap := filepath.Join(tmp, store.DatabaseFile(""))
	if err := b.store.Snapshot(r.Context(), snap); err != nil {
		code := http.StatusInternalServerError
		if errors.Is(err, errors.ErrUnsupported) {
			code = http.StatusNotImplemented
		}
		writeError(w, code, "backup: "+err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/gzip")
	w.Header().Set("Cache-Control", "no-store")
	n, err := b.write(r.Context(), w, secret, snap, keys)
	if err != nil {
		// The status is sent: the archive ends early, and the CLI, which reads it whole
		// before it keeps it, says so.
		b.log.ErrorContext(r.Context(), "backup failed", "by", c.Username, "err", err)
		return
	}
	b.log.InfoContext(r.Context(), "backup taken", "by", c.Username, "keys", keys, "terraformerFiles", n)
}

// write writes the archive; it returns how many terraformer files it holds.
func (b *backupAPI) write(ctx context.Context, w io.Writer, secret []byte, snap string, keys bool) (int, error) {
	check, err := store.SealWithKey(secret, []byte(backupKeyCheck), []byte(backupManifest))
	if err != nil {
		return 0, err
	}
	gz := gzip.NewWriter(w)
	tw := tar.NewWriter(gz)
	now := b.store.Now()
	put := func(name string, mode int64, b []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: mode, Size: int64(len(b)), ModTime: now, Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err := tw.Write(b)
		return err
	}
	m, _ := json.MarshalIndent(BackupManifest{Format: backupFormat, KloudVersion: version.Version, CreatedAt: now, IncludesKeys: keys, KeyCheck: check}, "", "  ")
	if err := put(backupManifest, 0o600, m); err != nil {
		return 0, err
	}
	if keys {
		if err := put(store.SecretKeyFile, 0o600, secret); err != nil {
			return 0, err
		}
		for _, f := range []string{AdminKeyFile, KloudKeyFile} {
			b, err := os.ReadFile(filepath.Join(b.dataDir, f))
			if err != nil {
				return 0, fmt.Errorf("backup: %w", err)
			}
			if err := put(f, 0o400, b); err != nil {
				return 0, err
			}
		}
	}
	db, err := os.Open(snap)
	if err != nil {
		return 0, err
	}
	defer db.Close()
	st, err := db.Stat()
	if err != nil {
		return 0, err
	}
	if err := tw.WriteHeader(&tar.Header{Name: backupDB + store.DatabaseFile(""), Mode: 0o600, Size: st.Size(), ModTime: now, Typeflag: tar.TypeReg}); err != nil {
		return 0, err
	}
	if _, err := io.Copy(tw, db); err != nil {
		return 0, err
	}
	n := 0
	for rel, b := range terraformerFiles(filepath.Join(b.dataDir, "terraformer")) {
		if ctx.Err() != nil {
			return n, ctx.Err()
		}
		sealed, err := store.SealWithKey(secret, b, []byte(backupTF+rel))
		if err != nil {
			return n, err
		}
		if err := put(backupTF+rel, 0o600, sealed); err != nil {
			return n, err
		}
		n++
	}
	if err := tw.Close(); err != nil {
		return n, err
	}
	return n, gz.Close()
}

// terraformerFiles yields what a backup keeps of a terraformer data dir, by path relative to
// it: each stack's state (state.json), its variables (variables.json: credentials in clear,
// which the backup seals; a destroy runs with the last ones) and its work dir's files (content,
// lock file, terraform.tfstate); not the saved plan, .terraform (made again by init), leases or
// jobs.
func terraformerFiles(dir string) func(yield func(string, []byte) bool) {
	return func(yield func(string, []byte) bool) {
		stacks, _ := os.ReadDir(filepath.Join(dir, "stacks"))
		for _, st := range stacks {
			if !st.IsDir() {
				continue
			}
			base := path.Join("stacks", st.Name())
			var names []string
			for _, f := range []string{"state.json", "variables.json"} {
				if _, err := os.Stat(filepath.Join(dir, base, f)); err == nil {
					names = append(names, path.Join(base, f))
				}
			}
			work, _ := os.ReadDir(filepath.Join(dir, base, "work"))
			for _, e := range work {
				if e.Type().IsRegular() && e.Name() != ".kloud-plan.out" {
					names = append(names, path.Join(base, "work", e.Name()))
				}
			}
			for _, n := range names {
				b, err := os.ReadFile(filepath.Join(dir, n))
				if err != nil {
					continue // gone meanwhile (a destroyed stack)
				}
				if !yield(n, b) {
					return
				}
			}
		}
	}
}

// RestoreResult says what Restore wrote.
type RestoreResult struct {
	Manifest         BackupManifest `json:"manifest"`
	DataDir          string         `json:"dataDir"`
	TerraformerFiles int            `json:"terraformerFiles"`
	// Keys says where the secret key came from: "backup" or the --secret-key file.
	Keys string `json:"keys"`
}

// Restore writes the backup read from r into dataDir, which must not exist or be empty. The
// secret key is the backup's (taken with --include-keys) or, for a backup without keys, the
// file secretKey (the old data dir's secret.key); without either nothing is written. On an
// error, what was written is removed again.
func Restore(r io.Reader, dataDir, secretKey string) (_ RestoreResult, err error) {
	res := RestoreResult{DataDir: dataDir}
	entries, err := os.ReadDir(dataDir)
	switch {
	case err == nil && len(entries) > 0:
		return res, fmt.Errorf("data dir %s is not empty: restore only into an empty (or new) data dir", dataDir)
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return res, fmt.Errorf("data dir: %w", err)
	}
	gz, err := gzip.NewReader(r)
	if err != nil {
		return res, fmt.Errorf("not a kloud backup (gzip): %w", err)
	}
	tr := tar.NewReader(gz)
	hdr, err := tr.Next()
	if err != nil || hdr.Name != backupManifest {
		return res, fmt.Errorf("not a kloud backup: no %s first", backupManifest)
	}
	if err := json.NewDecoder(io.LimitReader(tr, 1<<20)).Decode(&res.Manifest); err != nil {
		return res, fmt.Errorf("backup manifest: %w", err)
	}
	if res.Manifest.Format != backupFormat {
		return res, fmt.Errorf("backup format %d: this kloud reads format %d", res.Manifest.Format, backupFormat)
	}
	var key []byte
	if secretKey != "" {
		if key, err = os.ReadFile(secretKey); err != nil {
			return res, fmt.Errorf("--secret-key: %w", err)
		}
		res.Keys = secretKey
	} else if !res.Manifest.IncludesKeys {
		return res, errors.New("this backup holds no keys (taken without --include-keys): pass --secret-key FILE, the secret.key of the kloud it came from; " +
			"without it the sealed credentials, signing keys and terraform states cannot be opened")
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return res, fmt.Errorf("data dir: %w", err)
	}
	defer func() {
		if err != nil {
			entries, _ := os.ReadDir(dataDir)
			for _, e := range entries {
				os.RemoveAll(filepath.Join(dataDir, e.Name()))
			}
		}
	}()
	checked := false
	checkKey := func() error {
		if checked {
			return nil
		}
		if key == nil {
			return errors.New("backup: the secret key is missing from a backup that says it has keys")
		}
		if _, err := store.OpenWithKey(key, res.Manifest.KeyCheck, []byte(backupManifest)); err != nil {
			return fmt.Errorf("the secret key does not open this backup (not the key of the kloud it came from?): %w", err)
		}
		checked = true
		// Written only once it is known to be the right one.
		return os.WriteFile(filepath.Join(dataDir, store.SecretKeyFile), key, 0o600)
	}
	if secretKey != "" {
		if err := checkKey(); err != nil {
			return res, err
		}
	}
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return res, fmt.Errorf("backup is damaged or cut short: %w", err)
		}
		name := hdr.Name
		if hdr.Typeflag != tar.TypeReg || !fs.ValidPath(name) || strings.Contains(name, "\\") {
			return res, fmt.Errorf("backup entry %q: not a file kloud writes", name)
		}
		if name == backupDB+store.DatabaseFile("") { // streamed: it is the big one
			if err := os.MkdirAll(filepath.Join(dataDir, "db"), 0o700); err != nil {
				return res, err
			}
			if err := copyToFile(filepath.Join(dataDir, filepath.FromSlash(name)), tr); err != nil {
				return res, fmt.Errorf("backup is damaged or cut short: %w", err)
			}
			continue
		}
		b, err := io.ReadAll(io.LimitReader(tr, 1<<30))
		if err != nil {
			return res, fmt.Errorf("backup is damaged or cut short: %w", err)
		}
		switch {
		case name == store.SecretKeyFile:
			if secretKey == "" {
				key = b
				res.Keys = "backup"
				if err := checkKey(); err != nil {
					return res, err
				}
			}
		case name == AdminKeyFile || name == KloudKeyFile:
			if err := os.WriteFile(filepath.Join(dataDir, name), b, 0o400); err != nil {
				return res, err
			}
		case strings.HasPrefix(name, backupTF+"stacks/"):
			if err := checkKey(); err != nil {
				return res, err
			}
			plain, err := store.OpenWithKey(key, b, []byte(name))
			if err != nil {
				return res, fmt.Errorf("backup entry %s: %w", name, err)
			}
			p := filepath.Join(dataDir, filepath.FromSlash(name))
			if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
				return res, err
			}
			if err := os.WriteFile(p, plain, 0o600); err != nil {
				return res, err
			}
			res.TerraformerFiles++
		default:
			return res, fmt.Errorf("backup entry %q: not a file kloud writes", name)
		}
	}
	if _, err := os.Stat(filepath.Join(dataDir, "db", store.DatabaseFile(""))); err != nil {
		return res, errors.New("backup has no database")
	}
	if err := checkKey(); err != nil {
		return res, err
	}
	return res, nil
}

// copyToFile writes r into a new file p (mode 0600) and flushes it.
func copyToFile(p string, r io.Reader) error {
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// CheckBackup reads a whole backup from r and returns its manifest: an archive cut short or
// damaged (gzip's checksum, tar's structure) is an error. `kloud backup` keeps nothing else.
func CheckBackup(r io.Reader) (BackupManifest, error) {
	var m BackupManifest
	gz, err := gzip.NewReader(r)
	if err != nil {
		return m, fmt.Errorf("not a kloud backup (gzip): %w", err)
	}
	tr := tar.NewReader(gz)
	hdr, err := tr.Next()
	if err != nil || hdr.Name != backupManifest {
		return m, fmt.Errorf("not a kloud backup: no %s first", backupManifest)
	}
	if err := json.NewDecoder(io.LimitReader(tr, 1<<20)).Decode(&m); err != nil {
		return m, fmt.Errorf("backup manifest: %w", err)
	}
	db := false
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return m, fmt.Errorf("backup is damaged or cut short: %w", err)
		}
		db = db || hdr.Name == backupDB+store.DatabaseFile("")
		if _, err := io.Copy(io.Discard, tr); err != nil {
			return m, fmt.Errorf("backup is damaged or cut short: %w", err)
		}
	}
	if _, err := io.Copy(io.Discard, gz); err != nil {
		return m, fmt.Errorf("backup is damaged or cut short: %w", err)
	}
	if !db {
		return m, errors.New("backup has no database")
	}
	return m, nil
}
