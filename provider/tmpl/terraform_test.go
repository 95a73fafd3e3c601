package tmpl_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/provider/tmpl"
)

// terraform runs the real terraform binary in dir, offline: an empty CLI config, no checkpoint
// calls, and none of the caller's TF_* settings.
type terraform struct {
	t   *testing.T
	bin string
	dir string
	env []string
}

func newTerraform(t *testing.T, dir string) *terraform {
	bin := testutil.RequireBinary(t, "terraform")
	cfg := filepath.Join(t.TempDir(), "empty.tfrc")
	if err := os.WriteFile(cfg, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TF_") && !strings.HasPrefix(kv, "CHECKPOINT_") {
			env = append(env, kv)
		}
	}
	env = append(env, "TF_CLI_CONFIG_FILE="+cfg, "CHECKPOINT_DISABLE=1", "TF_IN_AUTOMATION=1", "TF_INPUT=0")
	return &terraform{t: t, bin: bin, dir: dir, env: env}
}

func (tf *terraform) run(args ...string) string {
	tf.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, tf.bin, append(args, "-no-color")...)
	cmd.Dir, cmd.Env = tf.dir, tf.env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		tf.t.Fatalf("terraform %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

func writeFiles(t *testing.T, dir string, files map[string][]byte) {
	t.Helper()
	for n, b := range files {
		if err := os.WriteFile(filepath.Join(dir, n), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// cloudInit stands in for kloud's userdata rendering: something per machine (its label and a
// kite key) around the user's script.
func cloudInit(label, script string) string {
	return fmt.Sprintf("#cloud-config\n# kite key for %s: kitekey-%s-secret\nruncmd:\n  - %q\n", label, label, script)
}

// TestTerraformRoundTrip rewrites templates as kloud does before apply and checks with the real
// terraform that they still init, validate and plan, and that every machine instance gets its
// own user data.
func TestTerraformRoundTrip(t *testing.T) {
	cases := []struct {
		dir, attr string
		// machines: resource name → the user script (with count, every instance has it); ""
		// when the template sets none.
		machines map[string]string
		count    map[string]int
		// other holds the keys that must survive next to user_data in a nested input.
		other map[string]any
	}{
		{"hcl", "input",
			map[string]string{"web": "#!/bin/sh\necho \"web on ${HOSTNAME}\"\n", "db": "echo db", "cache": "", "tiny": ""},
			map[string]int{"web": 2}, nil},
		{"hcl_nested", "input.user_data",
			map[string]string{"web": "#!/bin/sh\necho web\n", "db": "echo db", "worker": "", "cache": ""},
			map[string]int{"web": 2}, map[string]any{"web": 3.0, "db": 1.0, "worker": 2.0}},
		{"json", "input.user_data",
			map[string]string{"web": "#!/bin/sh\necho \"web on ${HOSTNAME}\"\n", "db": "echo db", "worker": "", "cache": ""},
			map[string]int{"web": 2}, map[string]any{"web": 3.0, "db": 1.0, "worker": 2.0}},
	}
	for _, tc := range cases {
		t.Run(tc.dir, func(t *testing.T) {
			orig := readDir(t, filepath.Join("testdata/roundtrip", tc.dir))

			// The user's template is valid terraform to begin with.
			dir0 := t.TempDir()
			writeFiles(t, dir0, orig)
			tf0 := newTerraform(t, dir0)
			tf0.run("init", "-input=false", "-backend=false")
			tf0.run("validate")

			c := mustParse(t, orig)
			machineTypes := map[string]string{"terraform_data": tc.attr}
			if err := c.Validate(machineTypes); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			want := map[string]string{} // instance address → user data
			values := map[string]any{}  // variable values for terraform
			resources := c.Resources("terraform_data")
			if len(resources) != len(tc.machines) {
				t.Fatalf("Resources = %+v, want %d", resources, len(tc.machines))
			}
			for _, r := range resources {
				script, ok, err := c.LiteralString(r.Type, r.Name, tc.attr)
				if err != nil {
					t.Fatal(err)
				}
				if script != tc.machines[r.Name] || ok != (script != "") {
					t.Fatalf("%s: LiteralString = %q, %v; want %q", r.Name, script, ok, tc.machines[r.Name])
				}
				v := "kloud_user_data_" + r.Name
				if r.Count {
					n, _ := c.LiteralAttrs(r.Type, r.Name)["count"].(int64)
					if int(n) != tc.count[r.Name] {
						t.Fatalf("%s: count %d", r.Name, n)
					}
					var list []string
					for i := range int(n) {
						label := fmt.Sprintf("%s.%d", r.Name, i)
						list = append(list, cloudInit(label, script))
						want[fmt.Sprintf("terraform_data.%s[%d]", r.Name, i)] = list[i]
					}
					values[v] = list
					if err := c.DeclareVariable(v, "list(string)", true); err != nil {
						t.Fatal(err)
					}
				} else {
					values[v] = cloudInit(r.Name, script)
					want["terraform_data."+r.Name] = values[v].(string)
					if err := c.DeclareVariable(v, "string", true); err != nil {
						t.Fatal(err)
					}
				}
				if err := c.SetUserData(r.Type, r.Name, tc.attr, v); err != nil {
					t.Fatalf("SetUserData(%s): %v", r.Name, err)
				}
			}
			if err := c.CheckSecretRefs([]string{"size"}); err == nil && tc.other != nil {
				t.Error("CheckSecretRefs: var.size is used in resources, want an error")
			}

			dir := t.TempDir()
			files := c.Files()
			writeFiles(t, dir, files)
			vars, err := json.Marshal(values)
			if err != nil {
				t.Fatal(err)
			}
			writeFiles(t, dir, map[string][]byte{"kloud.tfvars.json": vars})

			tf := newTerraform(t, dir)
			tf.run("init", "-input=false", "-backend=false")
			tf.run("validate")
			out := tf.run("plan", "-input=false", "-var-file=kloud.tfvars.json", "-out=tfplan")
			if strings.Contains(out, "-secret") {
				t.Errorf("plan output shows the sensitive user data:\n%s", out)
			}
			if !strings.Contains(out, fmt.Sprintf("Plan: %d to add", len(want))) {
				t.Errorf("plan output does not add %d resources:\n%s", len(want), out)
			}

			var plan struct {
				ResourceChanges []struct {
					Address string
					Change  struct {
						Actions []string
						After   map[string]any
					}
				} `json:"resource_changes"`
			}
			if err := json.Unmarshal([]byte(tf.run("show", "-json", "tfplan")), &plan); err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for _, rc := range plan.ResourceChanges {
				if !reflect.DeepEqual(rc.Change.Actions, []string{"create"}) {
					t.Errorf("%s: actions %q", rc.Address, rc.Change.Actions)
				}
				input := rc.Change.After["input"]
				if tc.attr == "input" {
					got[rc.Address], _ = input.(string)
					continue
				}
				m, _ := input.(map[string]any)
				got[rc.Address], _ = m["user_data"].(string)
				name := strings.TrimPrefix(rc.Address, "terraform_data.")
				name, _, _ = strings.Cut(name, "[")
				if size, ok := tc.other[name]; ok && m["size"] != size {
					t.Errorf("%s: planned input %v lost size %v", rc.Address, m, size)
				}
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("planned user data\n%q\nwant\n%q", got, want)
			}

			// The rewritten files are what Files said, and the user's files kept their
			// comments.
			for n := range orig {
				for _, line := range strings.Split(string(orig[n]), "\n") {
					if i := strings.Index(line, "#"); i >= 0 && !strings.Contains(line, "$${") && !strings.Contains(line, "#!/bin/sh") {
						if !bytes.Contains(files[n], []byte(line[i:])) {
							t.Errorf("%s: comment %q lost", n, line[i:])
						}
					}
				}
			}
			if _, ok := files[tmpl.GeneratedFile]; !ok {
				t.Error("no generated file")
			}
		})
	}
}
