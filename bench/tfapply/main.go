// Command tfapply measures what terraformer adds to a Terraform apply: terraformer.apply through
// terraformer.Client, end to end until the job has succeeded (kite call over loopback, engine,
// `terraform apply -json`, progress parsing, `terraform show -json` of the state, job
// persistence, the watch stream), against `terraform apply -auto-approve` run directly, on the same
// configuration (10 terraform_data resources), the same terraform binary and the same CLI config
// (offline provider mirror), in the same run, with the runs of the two interleaved.
//
// `terraform init` is done beforehand for both (terraformer's first apply runs it and later
// applies skip it while nothing changed; the direct side runs it once), and neither side's
// warm-up apply is counted. Every measured apply changes a variable, so all 10 resources are
// updated every time.
//
//	go run ./bench/tfapply [-n 10]
//
// It prints both medians and the ratio, and whether terraformer is within the target:
// median(terraformer) ≤ 1.10 × median(terraform) + 0.3 s. It exits 1 if not.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/terraformer"
	"github.com/kloud-dev/kloud/terraformer/tfrun"
	"github.com/kloud-dev/kloud/terraformer/tfsandbox"
)

const config = `
variable "gen" {
  type    = number
  default = 0
}
resource "terraform_data" "r" {
  count = 10
  input = "gen-${var.gen}"
}
`

func main() {
	tfsandbox.MaybeRun() // tfrun runs terraform through this binary as its sandbox launcher
	n := flag.Int("n", 10, "measured applies per side")
	tf := flag.String("terraform", "", "terraform binary (default: $TERRAFORM, else terraform on PATH, else $KLOUD_CACHE/bin/terraform)")
	cfg := flag.String("cli-config", terraformer.DefaultCLIConfig(), "Terraform CLI config (offline provider mirror)")
	flag.Parse()
	if err := run(*n, *tf, *cfg); err != nil {
		fmt.Fprintln(os.Stderr, "tfapply:", err)
		os.Exit(2)
	}
}

func run(n int, tf, cfg string) error {
	ctx := context.Background()
	if tf == "" {
		tf = findTerraform()
	}
	if _, err := os.Stat(cfg); err != nil {
		return fmt.Errorf("cli config: %w (run scripts/tf-mirror.sh)", err)
	}
	tmp, err := os.MkdirTemp("", "tfapply-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	direct, err := newDirect(ctx, filepath.Join(tmp, "direct"), tf, cfg)
	if err != nil {
		return err
	}
	tfr, err := newTerraformer(ctx, filepath.Join(tmp, "terraformer"), tf, cfg)
	if err != nil {
		return err
	}
	defer tfr.close()

	// Warm-up: init (both), first apply (both), not counted.
	if err := direct.apply(ctx, 0); err != nil {
		return err
	}
	if _, err := tfr.apply(ctx, 0, true); err != nil {
		return err
	}
	var rawT, tfT, jobT []time.Duration
	for i := 1; i <= n; i++ {
		start := time.Now()
		if err := direct.apply(ctx, i); err != nil {
			return err
		}
		rawT = append(rawT, time.Since(start))
		start = time.Now()
		j, err := tfr.apply(ctx, i, false)
		if err != nil {
			return err
		}
		tfT = append(tfT, time.Since(start))
		jobT = append(jobT, j.FinishedAt.Sub(j.CreatedAt))
	}

	version := tfr.engine.Version()
	raw, via := median(rawT), median(tfT)
	limit := time.Duration(1.10*float64(raw)) + 300*time.Millisecond
	fmt.Printf("terraform %s, %s/%s, %d CPUs, %d measured applies each (10 terraform_data updated per apply; init done beforehand for both)\n",
		version, runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), n)
	fmt.Printf("terraform apply -auto-approve   median %s  min %s  max %s\n", ms(raw), ms(slices.Min(rawT)), ms(slices.Max(rawT)))
	fmt.Printf("terraformer.apply via Client    median %s  min %s  max %s\n", ms(via), ms(slices.Min(tfT)), ms(slices.Max(tfT)))
	fmt.Printf("  of which inside the engine (job created -> finished: apply -json, show -json, persistence) median %s\n", ms(median(jobT)))
	fmt.Printf("overhead %s, ratio %.2fx; target <= 1.10x + 300 ms = %s: ", ms(via-raw), float64(via)/float64(raw), ms(limit))
	if via > limit {
		fmt.Println("MISSED")
		os.Exit(1)
	}
	fmt.Println("met")
	return nil
}

func findTerraform() string {
	if p := os.Getenv("TERRAFORM"); p != "" {
		return p
	}
	if p, err := exec.LookPath("terraform"); err == nil {
		return p
	}
	cache := os.Getenv("KLOUD_CACHE")
	if cache == "" {
		cache = "/var/cache/kloud"
	}
	return filepath.Join(cache, "bin", "terraform")
}

// directRunner runs terraform itself in a working directory.
type directRunner struct {
	dir, tf string
	env     []string
}

func newDirect(ctx context.Context, dir, tf, cfg string) (*directRunner, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "main.tf"), []byte(config), 0o600); err != nil {
		return nil, err
	}
	d := &directRunner{dir: dir, tf: tf, env: append(os.Environ(), "TF_CLI_CONFIG_FILE="+cfg, "TF_IN_AUTOMATION=1", "CHECKPOINT_DISABLE=1")}
	return d, d.terraform(ctx, "init", "-input=false", "-no-color")
}

func (d *directRunner) terraform(ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, d.tf, args...)
	cmd.Dir, cmd.Env = d.dir, d.env
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("terraform %v: %w\n%s", args, err, out)
	}
	return nil
}

func (d *directRunner) apply(ctx context.Context, gen int) error {
	return d.terraform(ctx, "apply", "-auto-approve", "-input=false", "-no-color", "-var", "gen="+strconv.Itoa(gen))
}

// tfRunner is a terraformer served in-process on loopback, with a kloud-style key server, and a
// Client connected as kloud.
type tfRunner struct {
	engine  *tfrun.Engine
	kite    *kite.Kite
	srv     *httptest.Server
	keys    *httptest.Server
	clientK *kite.Kite
	client  *terraformer.Client
}

func newTerraformer(ctx context.Context, dir, tf, cfg string) (*tfRunner, error) {
	discard := slog.New(slog.DiscardHandler)
	kr, err := kitekey.NewKeyring(ctx, kitekey.KeyringOptions{Store: &kitekey.FileStore{Path: filepath.Join(dir, "keys.json")}})
	if err != nil {
		return nil, err
	}
	r := &tfRunner{}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /kite/keys", func(w http.ResponseWriter, _ *http.Request) {
		json.NewEncoder(w).Encode(map[string]any{"current": kr.Current().ID, "keys": kr.Public()})
	})
	r.keys = httptest.NewServer(mux)
	if r.engine, err = tfrun.New(ctx, tfrun.Options{Dir: dir, TerraformPath: tf, CLIConfigFile: cfg, Logger: discard}); err != nil {
		return nil, err
	}
	if r.kite, err = kite.New(kite.Options{
		Identity:      kite.Identity{Name: terraformer.Name},
		Authenticator: terraformer.NewAuthenticator(terraformer.AuthOptions{KloudURL: r.keys.URL}),
		Logger:        discard,
	}); err != nil {
		return nil, err
	}
	if _, err := terraformer.New(terraformer.Options{Engine: r.engine, Kite: r.kite, Logger: discard}); err != nil {
		return nil, err
	}
	r.srv = httptest.NewServer(terraformer.Handler(r.kite, r.engine))
	signer := &kitekey.Signer{Current: kr.Current, Issuer: "kontrol"}
	key, err := signer.KiteKey("kloud", uuid.NewString(), r.keys.URL+"/kite")
	if err != nil {
		return nil, err
	}
	if r.clientK, err = kite.New(kite.Options{Identity: kite.Identity{Name: "kloud"}, Logger: discard}); err != nil {
		return nil, err
	}
	r.client = terraformer.NewClient(r.clientK, r.srv.URL, func(context.Context) (kite.Auth, error) {
		return kite.Auth{Type: kite.AuthKiteKey, Key: key}, nil
	})
	return r, nil
}

func (r *tfRunner) apply(ctx context.Context, gen int, withFiles bool) (*tfrun.Job, error) {
	req := terraformer.Request{ContentID: "bench", Variables: map[string]any{"gen": gen}}
	if withFiles {
		req.Files = map[string]string{"main.tf": config}
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	id, err := r.client.Apply(ctx, req)
	if err != nil {
		return nil, err
	}
	return r.client.Wait(ctx, id, nil)
}

func (r *tfRunner) close() {
	r.client.Close()
	r.clientK.Close()
	r.kite.Close()
	r.srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r.engine.Close(ctx)
	r.keys.Close()
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func ms(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond)) }
