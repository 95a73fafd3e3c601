package cli_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/kloud/cli"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/docker"
)

// TestTemplateCreateProviderRules (issue 18 item 2): `kloud template create` of a docker
// template with privileged = true fails (exit code not 0) with the docker provider's refusal,
// naming file, line, rule and what is allowed, and stores nothing; one within the rules is
// created.
func TestTemplateCreateProviderRules(t *testing.T) {
	t.Parallel()
	reg := provider.NewRegistry()
	d, err := docker.New(docker.Options{Host: "unix://" + filepath.Join(t.TempDir(), "no-daemon.sock"), Image: "kloud-test", StateDir: t.TempDir(),
		Endpoint: "http://127.0.0.1:1", NoFirewall: true})
	if err != nil {
		t.Fatal(err)
	}
	reg.Register(d.Provider())
	kloudDir := t.TempDir()
	e := kloudtest.Start(t, kloudtest.Options{DataDir: kloudDir, Providers: reg})
	run := func(args ...string) (int, string, string) {
		t.Helper()
		var out, errOut bytes.Buffer
		code := cli.Run(t.Context(), append(args, "--url", e.URL, "--data-dir", kloudDir), &out, &errOut)
		return code, out.String(), errOut.String()
	}
	write := func(src string) string {
		p := filepath.Join(t.TempDir(), "main.tf")
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	hostile := write("resource \"docker_container\" \"vm\" {\n  name  = \"vm\"\n  image = \"kloud\"\n  privileged = true\n}\n")
	code, stdout, stderr := run("template", "create", "--title", "privileged", "--file", hostile)
	if code == 0 {
		t.Fatalf("template create of a privileged docker machine: exit 0\nstdout:\n%s", stdout)
	}
	for _, want := range []string{"docker provider's rules", "main.tf:4: docker_container.vm: privileged is not allowed (rule docker-argument)", "may set only", "cpus", "memory"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("want %q in:\n%s", want, stderr)
		}
	}
	if ts, err := e.Server.Store().Templates().List(t.Context()); err != nil || len(ts) != 0 {
		t.Fatalf("refused, yet stored: %d templates (%v)", len(ts), err)
	}
	ok := write("resource \"docker_container\" \"vm\" {\n  name   = \"vm\"\n  image  = \"kloud\"\n  memory = 512\n}\n")
	if code, stdout, stderr := run("template", "create", "--title", "fine", "--file", ok); code != 0 {
		t.Fatalf("template create within the rules: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
}
