package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kloud-dev/kloud/internal/version"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/terraformer/tfapi"
	"github.com/kloud-dev/kloud/terraformer/tfclient"
)

type tfOptions struct {
	url, contentID, traceID string
	vars                    []string
}

func tfCmd(g *globals) *cobra.Command {
	o := &tfOptions{}
	cmd := &cobra.Command{
		Use:   "tf",
		Short: "Drive terraformer directly (debugging): plan, apply or destroy a directory of .tf files",
		Long: `Send the *.tf and *.tf.json files of a directory to terraformer, follow the job and print
its result. terraformer serves only kloud's identity: these commands present a kite key whose
subject is "kloud", by default <data-dir>/` + kloud.KloudKeyFile + ` (kloud serve writes it on first start;
or mint one with the admin key: kloud key create --username kloud --out <data-dir>/` + kloud.KloudKeyFile + `),
or the file given with --key.

The content id (one working directory and state in terraformer) defaults to the directory's name.
--var replaces all the variables of the content id; without --var the previous ones are kept.
Ctrl-C cancels the job.`,
	}
	pf := cmd.PersistentFlags()
	pf.StringVar(&o.url, "terraformer-url", envOr("KLOUD_TERRAFORMER_URL", "http://127.0.0.1:7001"), "terraformer URL (env KLOUD_TERRAFORMER_URL)")
	pf.StringVar(&o.contentID, "content-id", "", "content id (default: the directory's name)")
	pf.StringArrayVar(&o.vars, "var", nil, "variable NAME=VALUE (repeatable); VALUE is parsed as JSON if it is valid JSON, else taken as a string")
	pf.StringVar(&o.traceID, "trace-id", "", "trace id recorded in the job and terraformer's logs")
	for _, op := range []tfapi.Op{tfapi.OpPlan, tfapi.OpApply, tfapi.OpDestroy} {
		use, args := string(op)+" DIR", cobra.ExactArgs(1)
		if op == tfapi.OpDestroy {
			use, args = "destroy [DIR]", cobra.MaximumNArgs(1) // without DIR: the stored files
		}
		cmd.AddCommand(&cobra.Command{
			Use:   use,
			Short: "terraform " + string(op) + " through terraformer",
			Args:  args,
			RunE: func(cmd *cobra.Command, args []string) error {
				return g.tf(cmd.Context(), o, op, args)
			},
		})
	}
	return cmd
}

func (g *globals) tf(ctx context.Context, o *tfOptions, op tfapi.Op, args []string) error {
	req := tfapi.Request{ContentID: o.contentID, TraceID: o.traceID}
	if len(args) == 1 {
		files, err := readTFDir(args[0])
		if err != nil {
			return err
		}
		req.Files = files
		if req.ContentID == "" {
			req.ContentID = contentIDFor(args[0])
		}
	} else if req.ContentID == "" {
		return errors.New("destroy without DIR needs --content-id: the files stored for it are used")
	}
	if len(o.vars) > 0 {
		req.Variables = map[string]any{}
		for _, kv := range o.vars {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return fmt.Errorf("--var %q: want NAME=VALUE", kv)
			}
			var val any
			if json.Unmarshal([]byte(v), &val) != nil {
				val = v
			}
			req.Variables[k] = val
		}
	}
	if err := req.Validate(); err != nil {
		return err
	}
	auth, err := g.kloudAuth()
	if err != nil {
		return err
	}
	tc, err := g.tlsConfig()
	if err != nil {
		return err
	}
	k, err := kite.New(kite.Options{Identity: kite.Identity{Name: "kloud-cli", Version: version.Version}, TLSConfig: tc})
	if err != nil {
		return err
	}
	defer k.Close()
	// One plain dial first, so that an unreachable terraformer or a refused key is reported at
	// once rather than retried by the client.
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	conn, err := k.Dial(dctx, tfclient.KiteURL(o.url), auth)
	cancel()
	if err != nil {
		return explainTF(o.url, g.kloudKeyPath(), err)
	}
	conn.Close(nil)
	c := tfclient.NewClient(k, o.url, func(context.Context) (kite.Auth, error) { return auth, nil })
	defer c.Close()

	progress := g.stdout
	if g.json {
		progress = g.stderr
	}
	var id string
	switch op {
	case tfapi.OpPlan:
		id, err = c.Plan(ctx, req)
	case tfapi.OpApply:
		id, err = c.Apply(ctx, req)
	case tfapi.OpDestroy:
		id, err = c.Destroy(ctx, req)
	}
	if err != nil {
		return explainTF(o.url, g.kloudKeyPath(), err)
	}
	fmt.Fprintf(progress, "job %s: %s %s (%d files) on %s\n", id, op, req.ContentID, len(req.Files), o.url)
	job, err := c.Wait(ctx, id, func(ev tfapi.Event) { printEvent(progress, ev) })
	if job == nil && ctx.Err() != nil {
		fmt.Fprintf(progress, "interrupted: cancelling job %s\n", id)
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if job, err = c.Cancel(cctx, id); err != nil {
			return fmt.Errorf("cancel job %s: %w", id, err)
		}
	} else if job == nil {
		return explainTF(o.url, g.kloudKeyPath(), err)
	}
	if g.json {
		if err := g.printJSON(job); err != nil {
			return err
		}
	} else {
		printJob(g.stdout, job)
	}
	if job.Status != tfapi.StatusSucceeded {
		return fmt.Errorf("job %s %s", job.ID, job.Status)
	}
	return nil
}

// kloudKeyPath is --key, or <data-dir>/kloud.key.
func (g *globals) kloudKeyPath() string {
	if g.key != "" {
		return g.key
	}
	return filepath.Join(g.dataDir, kloud.KloudKeyFile)
}

func (g *globals) kloudAuth() (kite.Auth, error) {
	path := g.kloudKeyPath()
	key, err := kitekey.ReadFile(path)
	if err != nil {
		return kite.Auth{}, fmt.Errorf("%w\n  terraformer accepts only kloud's identity; mint a key for it with the admin key:\n    kloud key create --username kloud --out %s\n  or pass --key FILE", err, path)
	}
	if c, err := kitekey.ParseUnverified(key); err == nil && c.Subject != "kloud" {
		fmt.Fprintf(g.stderr, "warning: the key %s is for %q; terraformer serves only kloud's users (its --kloud-user)\n", path, c.Subject)
	}
	return kite.Auth{Type: kite.AuthKiteKey, Key: key}, nil
}

func explainTF(url, keyPath string, err error) error {
	switch {
	case errors.Is(err, kite.ErrAuth):
		return fmt.Errorf("terraformer at %s rejected the key %s: %w\n  it verifies keys with the kloud at its --kloud-url: use a key that kloud issued", url, keyPath, err)
	case errors.Is(err, kite.ErrPermission):
		return fmt.Errorf("%w\n  terraformer serves only kloud's identity: use a key whose user is kloud (kloud key create --username kloud)", err)
	case errors.Is(err, kite.ErrConflict):
		return fmt.Errorf("%w\n  another job runs on this content id: wait for it, or cancel it", err)
	case errors.Is(err, kite.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, kite.ErrClosed) || strings.Contains(err.Error(), "dial "):
		return fmt.Errorf("cannot reach terraformer at %s: %w\n  is it running? start it with `terraformer --kloud-url <kloud url>`, or point --terraformer-url at it", url, err)
	}
	return err
}

// readTFDir reads the *.tf and *.tf.json files of dir (not its subdirectories).
func readTFDir(dir string) (map[string]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", dir, err)
	}
	files := map[string]string{}
	for _, e := range entries {
		n := e.Name()
		if !e.Type().IsRegular() || strings.HasPrefix(n, ".") || !(strings.HasSuffix(n, ".tf") || strings.HasSuffix(n, ".tf.json")) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", n, err)
		}
		files[n] = string(b)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no *.tf or *.tf.json files in %s", dir)
	}
	return files, nil
}

var notContentID = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// contentIDFor makes a content id of the directory's name.
func contentIDFor(dir string) string {
	abs, err := filepath.Abs(dir)
	if err != nil {
		abs = dir
	}
	id := strings.TrimLeft(notContentID.ReplaceAllString(filepath.Base(abs), "-"), ".-")
	if len(id) > 200 {
		id = id[:200]
	}
	if id == "" {
		id = "tf"
	}
	return id
}

func printEvent(w io.Writer, ev tfapi.Event) {
	switch ev.Type {
	case tfapi.EventLog:
		fmt.Fprintf(w, "[%3d%%] %s\n", ev.Percent, ev.Line)
	case tfapi.EventStatus:
		fmt.Fprintf(w, "[%3d%%] job %s\n", ev.Percent, ev.Status)
	}
}

func printJob(w io.Writer, j *tfapi.Job) {
	took := ""
	if !j.StartedAt.IsZero() && !j.FinishedAt.IsZero() {
		took = " in " + j.FinishedAt.Sub(j.StartedAt).Round(10*time.Millisecond).String()
	}
	fmt.Fprintf(w, "\n%s %s: %s%s\n", j.Op, j.ContentID, j.Status, took)
	if j.Error != nil {
		fmt.Fprintf(w, "error (%s): %s\n", j.Error.Kind, j.Error.Message)
		for _, d := range j.Error.Diagnostics {
			fmt.Fprintf(w, "  %s\n", d)
		}
	}
	r := j.Result
	if r == nil {
		return
	}
	s := r.Summary
	if j.Op == tfapi.OpPlan {
		fmt.Fprintf(w, "Plan: %d to add, %d to change, %d to destroy.\n", s.Add, s.Change, s.Remove)
		for _, c := range r.Changes {
			fmt.Fprintf(w, "  %-8s %s\n", strings.Join(c.Actions, ","), c.Address)
		}
		return
	}
	fmt.Fprintf(w, "%d added, %d changed, %d destroyed.\n", s.Add, s.Change, s.Remove)
	if len(r.Resources) > 0 {
		fmt.Fprintln(w, "Resources:")
		for _, res := range r.Resources {
			id, _ := res.Values["id"].(string)
			tainted := ""
			if res.Tainted {
				tainted = " (tainted)"
			}
			fmt.Fprintf(w, "  %s%s  %s\n", res.Address, tainted, id)
		}
	}
	if len(r.Outputs) > 0 {
		fmt.Fprintln(w, "Outputs:")
		names := make([]string, 0, len(r.Outputs))
		for n := range r.Outputs {
			names = append(names, n)
		}
		slices.Sort(names)
		for _, n := range names {
			o := r.Outputs[n]
			v := "(sensitive)"
			if !o.Sensitive {
				b, _ := json.Marshal(o.Value)
				v = string(b)
			}
			fmt.Fprintf(w, "  %s = %s\n", n, v)
		}
	}
}
