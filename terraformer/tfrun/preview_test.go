package tfrun_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kloud-dev/kloud/terraformer/tfrun"
	"github.com/kloud-dev/kloud/terraformer/tfrun/tfruntest"
)

// TestPreviewKeepsContent: a preview plans other files against the content id's state (it sees
// the change) and leaves the stored files, variables and state as they were, so a destroy that
// brings no files runs the applied ones; a preview is a plan of files only.
func TestPreviewKeepsContent(t *testing.T) {
	t.Parallel()
	e := tfruntest.NewEngine(t, tfrun.Options{})
	const id = "preview"
	applied := `
variable "v" { type = string }
resource "terraform_data" "a" { input = var.v }
`
	previewed := `
variable "v" { type = string }
resource "terraform_data" "a" { input = "${var.v}-changed" }
resource "terraform_data" "b" { input = "new" }
`
	run(t, e, tfrun.Request{Op: tfrun.OpApply, ContentID: id, Files: files(applied), Variables: map[string]any{"v": "one"}}, tfrun.StatusSucceeded)
	work := tfruntest.WorkDir(e, id)
	vars := filepath.Join(filepath.Dir(work), "variables.json")
	varsBefore, err := os.ReadFile(vars)
	if err != nil {
		t.Fatal(err)
	}
	stateBefore, err := os.ReadFile(filepath.Join(work, "terraform.tfstate"))
	if err != nil {
		t.Fatal(err)
	}

	p := run(t, e, tfrun.Request{Op: tfrun.OpPlan, ContentID: id, Files: files(previewed), Variables: map[string]any{"v": "two"}, Preview: true}, tfrun.StatusSucceeded)
	acts := map[string][]string{}
	for _, c := range p.Result.Changes {
		acts[c.Address] = c.Actions
	}
	if !slices.Equal(acts["terraform_data.a"], []string{"update"}) || !slices.Equal(acts["terraform_data.b"], []string{"create"}) {
		t.Fatalf("preview's changes: %v", acts)
	}
	if b, err := os.ReadFile(filepath.Join(work, "main.tf")); err != nil || string(b) != applied {
		t.Fatalf("stored main.tf after the preview: %q %v", b, err)
	}
	if b, _ := os.ReadFile(vars); !bytes.Equal(b, varsBefore) {
		t.Fatalf("stored variables after the preview: %s, were %s", b, varsBefore)
	}
	if b, _ := os.ReadFile(filepath.Join(work, "terraform.tfstate")); !bytes.Equal(b, stateBefore) {
		t.Fatal("the preview changed the state")
	}
	if _, err := os.Stat(filepath.Join(work, ".kloud-plan.out")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the preview's plan file stayed: %v", err)
	}

	// An ordinary plan with no files runs the stored (applied) content: nothing to do.
	if p := run(t, e, tfrun.Request{Op: tfrun.OpPlan, ContentID: id}, tfrun.StatusSucceeded); p.Result == nil || len(p.Result.Changes) != 0 {
		t.Fatalf("plan of the stored content after a preview: %+v", p.Result)
	}
	d := run(t, e, tfrun.Request{Op: tfrun.OpDestroy, ContentID: id}, tfrun.StatusSucceeded)
	if d.Result == nil || len(d.Result.Resources) != 0 {
		t.Fatalf("destroy after a preview: %+v", d.Result)
	}

	for _, bad := range []tfrun.Request{
		{Op: tfrun.OpApply, ContentID: id, Files: files(previewed), Preview: true},
		{Op: tfrun.OpPlan, ContentID: id, Preview: true},
	} {
		if _, err := e.Submit(t.Context(), bad); !errors.Is(err, tfrun.ErrInvalid) {
			t.Errorf("preview %s with %d files: %v", bad.Op, len(bad.Files), err)
		}
	}
}

// TestPlantedContentSymlink: the work dir is the sandbox user's, so terraform could leave a
// symlink where the next request's content file goes; replacing the content replaces the link
// and never writes through it (to a file the sandbox user could not write itself).
func TestPlantedContentSymlink(t *testing.T) {
	t.Parallel()
	e := tfruntest.NewEngine(t, tfrun.Options{})
	const id = "planted"
	run(t, e, tfrun.Request{Op: tfrun.OpApply, ContentID: id, Files: files(`resource "terraform_data" "a" { input = "one" }`)}, tfrun.StatusSucceeded)
	work := tfruntest.WorkDir(e, id)
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(work, "main.tf")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, filepath.Join(work, "main.tf")); err != nil {
		t.Fatal(err)
	}
	next := `resource "terraform_data" "a" { input = "two" }`
	p := run(t, e, tfrun.Request{Op: tfrun.OpPlan, ContentID: id, Files: files(next)}, tfrun.StatusSucceeded)
	if b, _ := os.ReadFile(victim); string(b) != "keep" {
		t.Fatalf("the content was written through the planted symlink: %q", b)
	}
	if fi, err := os.Lstat(filepath.Join(work, "main.tf")); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("main.tf after the plan: %v %v", fi, err)
	}
	if p.Result == nil || len(p.Result.Changes) != 1 {
		t.Fatalf("plan of the new content: %+v", p.Result)
	}
	run(t, e, tfrun.Request{Op: tfrun.OpDestroy, ContentID: id}, tfrun.StatusSucceeded)
}
