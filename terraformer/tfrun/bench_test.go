package tfrun_test

import (
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/terraformer/tfrun"
	"github.com/kloud-dev/kloud/terraformer/tfrun/tfruntest"
)

const bench10 = `
variable "gen" {
  type    = number
  default = 0
}
resource "terraform_data" "r" {
  count = 10
  input = "gen-${var.gen}"
}
`

// BenchmarkApply10 compares an apply through the engine (apply -json, progress parsing, state
// snapshot with show -json, job persistence) with a plain `terraform apply` of the same
// configuration. Every iteration updates all 10 terraform_data resources; init is done beforehand
// in both cases.
func BenchmarkApply10(b *testing.B) {
	tf, cfg := tfruntest.Setup(b)
	b.Run("raw", func(b *testing.B) {
		dir := b.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "main.tf"), []byte(bench10), 0o600); err != nil {
			b.Fatal(err)
		}
		env := append(os.Environ(), "TF_CLI_CONFIG_FILE="+cfg, "TF_IN_AUTOMATION=1", "CHECKPOINT_DISABLE=1")
		terraform := func(args ...string) {
			cmd := exec.Command(tf, args...)
			cmd.Dir, cmd.Env = dir, env
			if out, err := cmd.CombinedOutput(); err != nil {
				b.Fatalf("terraform %v: %v\n%s", args, err, out)
			}
		}
		terraform("init", "-input=false", "-no-color")
		for i := 0; b.Loop(); i++ {
			terraform("apply", "-auto-approve", "-input=false", "-no-color", "-var", "gen="+strconv.Itoa(i+1))
		}
	})
	b.Run("engine", func(b *testing.B) {
		e := tfruntest.NewEngine(b, tfrun.Options{Logger: slog.New(slog.DiscardHandler)})
		apply := func(req tfrun.Request) {
			j, err := e.Submit(b.Context(), req)
			if err != nil {
				b.Fatal(err)
			}
			if j = tfruntest.Wait(b, e, j.ID, time.Minute); j.Status != tfrun.StatusSucceeded {
				b.Fatalf("apply: %s %v", j.Status, j.Err())
			}
		}
		apply(tfrun.Request{Op: tfrun.OpApply, ContentID: "bench", Files: files(bench10)})
		for i := 0; b.Loop(); i++ {
			apply(tfrun.Request{Op: tfrun.OpApply, ContentID: "bench", Variables: map[string]any{"gen": i + 1}})
		}
	})
}
