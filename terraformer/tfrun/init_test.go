package tfrun_test

import (
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/terraformer/tfrun"
	"github.com/kloud-dev/kloud/terraformer/tfrun/tfruntest"
)

// A Terraform provider of the offline mirror that a fresh work dir's `terraform init` installs.
type mirrored struct {
	name, source, version string
}

func (p mirrored) config() string {
	return fmt.Sprintf("terraform {\n  required_providers {\n    %s = { source = %q, version = %q }\n  }\n}\n", p.name, p.source, p.version)
}

// dir is the provider's package directory as init installs it under .terraform/providers.
func (p mirrored) dir() string {
	return filepath.Join(".terraform", "providers", "registry.terraform.io", filepath.FromSlash(p.source), p.version, runtime.GOOS+"_"+runtime.GOARCH)
}

// mirroredProviders are hashicorp/local (always in the test mirror) and, when the mirror has it,
// the 75 MB kreuzwerker/docker that the docker provider's stacks need.
func mirroredProviders(t testing.TB) []mirrored {
	ps := []mirrored{{"local", "hashicorp/local", tfruntest.LocalProviderVersion}}
	docker := mirrored{"docker", "kreuzwerker/docker", "4.6.0"}
	if _, err := os.Stat(filepath.Join(tfruntest.Cache(), "tf-mirror", "registry.terraform.io", "kreuzwerker", "docker", docker.version)); err == nil {
		ps = append(ps, docker)
	} else {
		t.Logf("kreuzwerker/docker %s is not in the mirror (scripts/build-docker-provider.sh): only hashicorp/local", docker.version)
	}
	return ps
}

// A stack's first build runs `terraform init` in a new work dir. It must not copy the provider
// binaries there (75 MB for the Docker provider, per stack): from an unpacked filesystem mirror
// (scripts/tf-mirror.sh writes one) Terraform links the provider's package directory instead,
// which is what makes a shared plugin cache unnecessary (and a cache the sandboxed terraform
// could write would be one it could poison for every other stack). This checks that it still
// does, inside the sandbox, and that the work dir stays small.
func TestInitLinksProviders(t *testing.T) {
	e := tfruntest.NewEngine(t, tfrun.Options{})
	for _, p := range mirroredProviders(t) {
		t.Run(p.name, func(t *testing.T) {
			id := "init-" + p.name
			run(t, e, tfrun.Request{Op: tfrun.OpPlan, ContentID: id, Files: files(p.config())}, tfrun.StatusSucceeded)
			work := tfruntest.WorkDir(e, id)
			pkg := filepath.Join(work, p.dir())
			fi, err := os.Lstat(pkg)
			if err != nil {
				t.Fatalf("init installed no %s: %v", p.source, err)
			}
			if fi.Mode()&fs.ModeSymlink == 0 {
				t.Errorf("%s is a copy (mode %s), not a link into the mirror: every new stack copies the provider", pkg, fi.Mode())
			} else if target, err := filepath.EvalSymlinks(pkg); err != nil {
				t.Errorf("%s: %v", pkg, err)
			} else if rel, err := filepath.Rel(filepath.Join(tfruntest.Cache(), "tf-mirror"), target); err != nil || strings.HasPrefix(rel, "..") {
				t.Errorf("%s links to %s, outside the mirror", pkg, target)
			}
			var size int64
			filepath.WalkDir(filepath.Join(work, ".terraform"), func(_ string, d fs.DirEntry, err error) error {
				if err == nil && d.Type().IsRegular() {
					if info, err := d.Info(); err == nil {
						size += info.Size()
					}
				}
				return nil
			})
			if size > 1<<20 {
				t.Errorf("the work dir's .terraform holds %d bytes of files after init: want links, not copies", size)
			}
			t.Logf("%s: .terraform holds %d bytes of regular files; %s → mirror", p.source, size, p.dir())
		})
	}
}

// initTimer is a slog handler that measures the engine's `terraform init` commands: from the
// "terraform starting" record of an init to its "terraform exited" record.
type initTimer struct {
	mu    sync.Mutex
	start time.Time
	total time.Duration
	n     int
}

func (h *initTimer) Enabled(context.Context, slog.Level) bool { return true }
func (h *initTimer) WithAttrs(as []slog.Attr) slog.Handler    { return (&attrs{h: h}).WithAttrs(as) }
func (h *initTimer) WithGroup(string) slog.Handler            { return h }
func (h *initTimer) Handle(_ context.Context, r slog.Record) error {
	return h.record(r, false)
}

func (h *initTimer) record(r slog.Record, isInit bool) error {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "cmd" && a.Value.String() == "init" {
			isInit = true
		}
		return true
	})
	if !isInit {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	switch r.Message {
	case "terraform starting":
		h.start = r.Time
	case "terraform exited":
		if !h.start.IsZero() {
			h.total += r.Time.Sub(h.start)
			h.n++
			h.start = time.Time{}
		}
	}
	return nil
}

// attrs is initTimer after With (the engine logs through logger.With("cmd", name, ...)).
type attrs struct {
	h      *initTimer
	isInit bool
}

func (a *attrs) Enabled(context.Context, slog.Level) bool { return true }
func (a *attrs) WithGroup(string) slog.Handler            { return a }
func (a *attrs) WithAttrs(as []slog.Attr) slog.Handler {
	n := &attrs{h: a.h, isInit: a.isInit}
	for _, x := range as {
		if x.Key == "cmd" && x.Value.String() == "init" {
			n.isInit = true
		}
	}
	return n
}
func (a *attrs) Handle(_ context.Context, r slog.Record) error { return a.h.record(r, a.isInit) }

// BenchmarkInitFresh is the `terraform init` of a new stack's work dir: "engine" is the engine's
// init (sandboxed: the launcher, namespaces, uid 65534, -json, -upgrade), timed from the engine's
// own log records, for a plan on a new content id per iteration; "raw" is `terraform init
// -upgrade` run directly in a new directory with the same CLI config. Both install the provider
// by linking the mirror's package directory (TestInitLinksProviders), so neither copies 75 MB.
//
//	set -a; . /var/cache/kloud/env; set +a; go test ./terraformer/tfrun -run '^$' -bench InitFresh -benchtime 10x
func BenchmarkInitFresh(b *testing.B) {
	tf, cfg := tfruntest.Setup(b)
	for _, p := range mirroredProviders(b) {
		b.Run(p.name+"/raw", func(b *testing.B) {
			env := append(os.Environ(), "TF_CLI_CONFIG_FILE="+cfg, "TF_IN_AUTOMATION=1", "CHECKPOINT_DISABLE=1")
			for b.Loop() {
				b.StopTimer()
				dir := b.TempDir()
				if err := os.WriteFile(filepath.Join(dir, "main.tf"), []byte(p.config()), 0o600); err != nil {
					b.Fatal(err)
				}
				cmd := exec.Command(tf, "init", "-input=false", "-no-color", "-upgrade")
				cmd.Dir, cmd.Env = dir, env
				b.StartTimer()
				if out, err := cmd.CombinedOutput(); err != nil {
					b.Fatalf("terraform init: %v\n%s", err, out)
				}
			}
		})
		b.Run(p.name+"/engine", func(b *testing.B) {
			timer := &initTimer{}
			e := tfruntest.NewEngine(b, tfrun.Options{Logger: slog.New(timer)})
			var wall time.Duration
			for i := 0; b.Loop(); i++ {
				t0 := time.Now()
				j, err := e.Submit(b.Context(), tfrun.Request{Op: tfrun.OpPlan, ContentID: fmt.Sprintf("fresh-%d", i), Files: files(p.config())})
				if err != nil {
					b.Fatal(err)
				}
				if j = tfruntest.Wait(b, e, j.ID, time.Minute); j.Status != tfrun.StatusSucceeded {
					b.Fatalf("plan: %s %v", j.Status, j.Err())
				}
				wall += time.Since(t0)
			}
			timer.mu.Lock()
			defer timer.mu.Unlock()
			if timer.n == 0 {
				b.Fatal("no init was timed: the engine's log records changed (see exec.go)")
			}
			// ns/op is the whole plan job (init, plan, show of the plan); init-ms/op is init alone.
			b.ReportMetric(float64(timer.total.Microseconds())/1000/float64(timer.n), "init-ms/op")
			b.ReportMetric(float64(wall.Microseconds())/1000/float64(b.N), "job-ms/op")
		})
	}
}

// TestInitWarnsNoLockFileNoise (issue 18 §5): installing providers from kloud's filesystem
// mirror makes `terraform init` warn "Incomplete lock file information for providers" (it
// could record the checksums of this platform only). The lock file never leaves the work dir,
// so the warning is noise in every job's log: a real apply that installs a provider must show
// the install, and not that warning, in its log, its events or its diagnostics.
func TestInitWarnsNoLockFileNoise(t *testing.T) {
	e := tfruntest.NewEngine(t, tfrun.Options{})
	p := mirroredProviders(t)[0]
	j := submit(t, e, tfrun.Request{Op: tfrun.OpApply, ContentID: "lockwarn", Files: files(p.config() + `
resource "terraform_data" "r" {
  input = "x"
}`)})
	ch, err := e.Watch(t.Context(), j.ID)
	if err != nil {
		t.Fatal(err)
	}
	var evs []tfrun.Event
	for ev := range ch {
		evs = append(evs, ev)
	}
	j = tfruntest.Wait(t, e, j.ID, time.Minute)
	log := strings.Join(j.Log, "\n")
	if j.Status != tfrun.StatusSucceeded || !strings.Contains(log, "Installed provider version: "+p.source) {
		t.Fatalf("apply: %s %v; log:\n%s", j.Status, j.Err(), log)
	}
	const noise = "Incomplete lock file information"
	if strings.Contains(log, noise) {
		t.Errorf("the job's log has terraform's lock file warning:\n%s", log)
	}
	for _, ev := range evs {
		if strings.Contains(ev.Line, noise) || (ev.Diagnostic != nil && strings.Contains(ev.Diagnostic.Summary, noise)) {
			t.Errorf("event %+v", ev)
		}
	}
}

// TestUndeclaredMirroredProvider (issue 18 §4): a configuration that uses a provider of the
// mirror without a required_providers entry makes Terraform look for hashicorp/NAME, which the
// mirror does not have; the job's error says which block to add, with the source the mirror
// has the provider under.
func TestUndeclaredMirroredProvider(t *testing.T) {
	e := tfruntest.NewEngine(t, tfrun.Options{})
	mirror := filepath.Join(tfruntest.Cache(), "tf-mirror", "registry.terraform.io", "kloud", "kloudlocal")
	if _, err := os.Stat(mirror); err != nil {
		t.Skipf("kloud/kloudlocal is not in the mirror: %v", err) // scripts/tf-mirror.sh puts it there
	}
	j := run(t, e, tfrun.Request{Op: tfrun.OpPlan, ContentID: "undeclared", Files: files(`
resource "kloudlocal_machine" "dev" {
}`)}, tfrun.StatusFailed)
	msg := j.Err().Error()
	t.Logf("error: %s", msg)
	want := `terraform { required_providers { kloudlocal = { source = "kloud/kloudlocal" } } }`
	if !strings.Contains(msg, want) {
		t.Errorf("the error does not say to add %s:\n%s", want, msg)
	}
}
