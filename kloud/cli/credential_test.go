package cli_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/kloud/cli"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/terraformer/terraformertest"
)

const cliSecret = "cli-SECRET-5f0e2a9c71"

type cliCred struct {
	Region    string `json:"region" kloud:"Region" default:"eu-1"`
	AccessKey string `json:"access_key" kloud:"Access key,required"`
	SecretKey string `json:"secret_key" kloud:"Secret key,secret,required"`
	Port      int    `json:"port" kloud:"Port" default:"443"`
}

type cliBootstrap struct {
	Network string `json:"network" kloud:"Network,required"`
}

type cliStack struct{}

func (cliStack) VerifyCredential(_ context.Context, c *provider.Credential) error {
	if v := c.Value.(*cliCred); v.AccessKey != "good-key" {
		return errors.New("access key " + v.AccessKey + " is unknown to testcloud")
	}
	return nil
}

func (cliStack) BootstrapTemplates(context.Context, *provider.Credential) ([]*provider.Template, error) {
	return []*provider.Template{{Files: map[string][]byte{"main.tf": []byte(`
variable "testcloud_region" {
  type = string
}
resource "terraform_data" "network" {
  input = "net-${var.testcloud_region}"
}
output "network" {
  value = terraform_data.network.output
}
`)}}}, nil
}

func (cliStack) ApplyTemplate(context.Context, *provider.Credential) (*provider.Template, error) {
	return nil, errors.New("no machines")
}

// TestUserCredentialCommands drives login, users, teams, credentials (with a real terraformer
// for bootstrap) and providers through the CLI, as an administrator and as a user.
func TestUserCredentialCommands(t *testing.T) {
	t.Parallel()
	reg := provider.NewRegistry()
	reg.Register(&provider.Provider{Name: "testcloud", ResourceType: "testcloud_machine",
		Schema: provider.Schema{NewCredential: func() any { return &cliCred{} }, NewBootstrap: func() any { return &cliBootstrap{} }},
		Stack:  func(*provider.BaseStack) (provider.Stack, error) { return cliStack{}, nil }})
	tf := terraformertest.Start(t, terraformertest.Options{})
	kloudDir, aliceDir := t.TempDir(), t.TempDir()
	e := kloudtest.Start(t, kloudtest.Options{DataDir: kloudDir, Providers: reg, Terraformer: tf.Client})
	var outputs bytes.Buffer // everything the commands printed, scanned for the secret at the end
	run := func(args ...string) (int, string, string) {
		t.Helper()
		var out, errOut bytes.Buffer
		code := cli.Run(t.Context(), append(args, "--url", e.URL), &out, &errOut)
		outputs.Write(out.Bytes())
		outputs.Write(errOut.Bytes())
		return code, out.String(), errOut.String()
	}
	admin := func(args ...string) (int, string, string) { return run(append(args, "--data-dir", kloudDir)...) }
	session := filepath.Join(aliceDir, cli.SessionFile)
	alice := func(args ...string) (int, string, string) {
		return run(append(args, "--data-dir", aliceDir, "--key", session)...)
	}
	must := func(code int, stdout, stderr string) string {
		t.Helper()
		if code != 0 {
			t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
		}
		return stdout
	}
	pwFile := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pwFile, []byte("alice's password\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	out := must(admin("user", "add", "alice", "--password-file", pwFile, "--email", "alice@example.com"))
	if !strings.Contains(out, "kloud login --username alice") {
		t.Fatalf("user add: %s", out)
	}
	if code, _, stderr := admin("user", "add", "Bad_Name"); code == 0 || !strings.Contains(stderr, "see --help") {
		t.Fatalf("user add with a bad name: %d %s", code, stderr)
	}

	// Login writes a 0600 session that --key then uses.
	badPw := filepath.Join(t.TempDir(), "bad")
	os.WriteFile(badPw, []byte("not it\n"), 0o600)
	if code, _, stderr := run("login", "--username", "alice", "--password-file", badPw, "--data-dir", aliceDir); code == 0 || !strings.Contains(stderr, "wrong username or password") {
		t.Fatalf("login with a wrong password: %d %s", code, stderr)
	}
	out = must(run("login", "--username", "alice", "--password-file", pwFile, "--data-dir", aliceDir))
	if !strings.Contains(out, "--key "+session) {
		t.Fatalf("login: %s", out)
	}
	if fi, err := os.Stat(session); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("session file: %v %v", fi, err)
	}
	out = must(alice("whoami"))
	if !strings.HasPrefix(out, "alice, authenticated with a session") || !strings.Contains(out, "in no team") {
		t.Fatalf("whoami: %s", out)
	}
	must(alice("team", "create", "red", "--title", "Red team"))
	must(admin("user", "add", "bob"))
	must(alice("team", "add-member", "red", "bob"))
	if code, _, stderr := alice("team", "remove-member", "red", "alice"); code == 0 || !strings.Contains(stderr, "--role admin") {
		t.Fatalf("last admin leaves: %d %s", code, stderr)
	}
	out = must(alice("team", "list"))
	if !regexp.MustCompile(`red\s+Red team\s+admin\s+alice \(admin\), bob`).MatchString(out) {
		t.Fatalf("team list:\n%s", out)
	}
	out = must(admin("user", "list"))
	if !regexp.MustCompile(`alice\s+member\s+alice@example.com\s+yes\s+-\s+red \(admin\)`).MatchString(out) {
		t.Fatalf("user list:\n%s", out)
	}

	out = must(alice("provider", "describe"))
	if !strings.Contains(out, "testcloud (machines: testcloud_machine)") || !regexp.MustCompile(`secret_key\s+Secret key\s+string\s+yes\s+yes`).MatchString(out) {
		t.Fatalf("provider describe:\n%s", out)
	}

	// Credentials: --field converts by type; unknown fields are named.
	if code, _, stderr := alice("credential", "add", "--provider", "testcloud", "--title", "x", "--field", "colour=red"); code == 0 || !strings.Contains(stderr, "fields: region, access_key, secret_key, port") {
		t.Fatalf("add with an unknown field: %d %s", code, stderr)
	}
	if code, _, stderr := alice("credential", "add", "--provider", "testcloud", "--title", "x", "--field", "access_key=k"); code == 0 || !strings.Contains(stderr, "kloud provider describe testcloud") {
		t.Fatalf("add without a required field: %d %s", code, stderr)
	}
	out = must(alice("credential", "add", "--provider", "testcloud", "--title", "laptop", "--field", "access_key=good-key",
		"--field", "secret_key="+cliSecret, "--field", "port=8080"))
	id := regexp.MustCompile(`added credential (\w+)`).FindStringSubmatch(out)
	if id == nil {
		t.Fatalf("credential add: %s", out)
	}
	dataFile := filepath.Join(t.TempDir(), "cred.json")
	os.WriteFile(dataFile, []byte(`{"access_key": "bad-key", "secret_key": "`+cliSecret+`"}`), 0o600)
	var added struct{ ID string }
	json.Unmarshal([]byte(must(alice("credential", "add", "--provider", "testcloud", "--title", "bad", "--data-file", dataFile, "--json"))), &added)
	if added.ID == "" {
		t.Fatal("credential add --json gave no id")
	}

	out = must(alice("credential", "describe", id[1]))
	for _, want := range []string{`port\s+Port\s+integer\s+8080`, `secret_key\s+Secret key\s+string\s+\(secret, set\)`, `region\s+Region\s+string\s+eu-1`, `verified:\s+not checked`} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("describe lacks %s:\n%s", want, out)
		}
	}
	must(alice("credential", "authenticate", id[1]))
	if code, _, stderr := alice("credential", "authenticate", added.ID); code == 0 || !strings.Contains(stderr, "bad-key is unknown to testcloud") {
		t.Fatalf("authenticate a bad credential: %d %s", code, stderr)
	}
	out = must(alice("credential", "list"))
	if !regexp.MustCompile(id[1] + `\s+laptop\s+testcloud\s+red\s+alice\s+yes\s+none`).MatchString(out) {
		t.Fatalf("credential list:\n%s", out)
	}

	// Bootstrap follows the job; --json prints its events.
	out = must(alice("credential", "bootstrap", id[1]))
	if !strings.Contains(out, "100%") || !strings.Contains(out, "credential "+id[1]+" bootstrapped") || !strings.Contains(out, "  | ") {
		t.Fatalf("bootstrap:\n%s", out)
	}
	out = must(alice("credential", "bootstrap", id[1]))
	if !strings.Contains(out, "already bootstrapped") {
		t.Fatalf("second bootstrap: %s", out)
	}
	if code, _, stderr := alice("credential", "remove", id[1]); code == 0 || !strings.Contains(stderr, "--destroy") {
		t.Fatalf("remove a bootstrapped credential: %d %s", code, stderr)
	}
	out = must(alice("credential", "bootstrap", id[1], "--destroy", "--json"))
	sc := bufio.NewScanner(strings.NewReader(out))
	events, last := 0, map[string]any{}
	for sc.Scan() {
		if err := json.Unmarshal(sc.Bytes(), &last); err != nil {
			t.Fatalf("bootstrap --json line %q: %v", sc.Text(), err)
		}
		events++
	}
	if events < 2 || last["status"] != "succeeded" || last["percentage"] != float64(100) {
		t.Fatalf("bootstrap --destroy --json: %d events, last %v", events, last)
	}
	must(alice("credential", "remove", id[1]))

	// Logout revokes the session.
	must(alice("logout"))
	if _, err := os.Stat(session); !os.IsNotExist(err) {
		t.Fatalf("session file after logout: %v", err)
	}
	if code, _, _ := alice("whoami"); code == 0 {
		t.Fatal("whoami after logout worked")
	}
	if code, _, stderr := run("logout", "--data-dir", aliceDir); code == 0 || !strings.Contains(stderr, "not logged in") {
		t.Fatalf("second logout: %d %s", code, stderr)
	}
	if bytes.Contains(outputs.Bytes(), []byte(cliSecret)) {
		t.Fatal("a command printed the secret")
	}
}

type schemaCred struct {
	Token string `json:"token" kloud:"Token,secret,required" min:"4"`
	Zone  string `json:"zone" kloud:"Zone,immutable" enum:"a|b" default:"a" doc:"where it runs"`
	Size  int    `json:"size" kloud:"Size" min:"1" max:"8" default:"2"`
	Fast  bool   `json:"fast" kloud:"Fast"`
}

// TestCredentialFieldsFromSchema: `credential add|update --field` convert and check the fields
// against the provider's JSON Schema before calling kloud (the same messages as kloud's, without
// its error code), kloud refuses what only it can know (an immutable field's old value), and
// `provider describe` shows capabilities and the schema's rules.
func TestCredentialFieldsFromSchema(t *testing.T) {
	t.Parallel()
	reg := provider.NewRegistry()
	reg.Register(&provider.Provider{Name: "schemacloud", ResourceType: "schemacloud_machine",
		Capabilities: []provider.Capability{provider.CapStart, provider.CapInfo},
		Schema:       provider.Schema{NewCredential: func() any { return &schemaCred{} }},
		Stack:        func(*provider.BaseStack) (provider.Stack, error) { return cliStack{}, nil }})
	dir := t.TempDir()
	e := kloudtest.Start(t, kloudtest.Options{DataDir: dir, Providers: reg})
	run := func(args ...string) (int, string, string) {
		t.Helper()
		var out, errOut bytes.Buffer
		code := cli.Run(t.Context(), append(args, "--url", e.URL, "--data-dir", dir), &out, &errOut)
		return code, out.String(), errOut.String()
	}
	add := func(fields ...string) (int, string, string) {
		args := []string{"credential", "add", "--provider", "schemacloud", "--title", "t"}
		for _, f := range fields {
			args = append(args, "--field", f)
		}
		return run(args...)
	}
	for _, c := range []struct {
		fields []string
		want   string
	}{
		{[]string{"token=abcd", "size=big"}, `--field: field size must be an integer, not "big"`},
		{[]string{"token=abcd", "fast=maybe"}, `--field: field fast must be true or false, not "maybe"`},
		{[]string{"token=abcd", "colour=red"}, "--field: unknown field colour (fields: token, zone, size, fast)"},
		{[]string{"token=abcd", "zone=c"}, `schemacloud credential: field zone (Zone) must be one of a, b (enum; got "c")`},
		{[]string{"token=abcd", "size=9"}, "schemacloud credential: field size (Size) must be at most 8 (maximum; got 9)"},
		{[]string{"size=3"}, "schemacloud credential: field token (Token) is required"},
		{[]string{"token=abc"}, "schemacloud credential: field token (Token) must be at least 4 characters long (minLength)"},
	} {
		code, _, stderr := add(c.fields...)
		// The client's check: kloud's would carry its error code (invalidParams / -32602).
		if code == 0 || !strings.Contains(stderr, c.want) || !strings.Contains(stderr, "kloud provider describe schemacloud") ||
			strings.Contains(stderr, "32602") || strings.Contains(strings.ToLower(stderr), "invalid params") {
			t.Errorf("add %v: exit %d\n%s\nwant the client's %q", c.fields, code, stderr, c.want)
		}
	}
	code, out, stderr := add("token=abcd", "fast=true", "size=3")
	id := regexp.MustCompile(`added credential (\w+)`).FindStringSubmatch(out)
	if code != 0 || id == nil {
		t.Fatalf("add: %d %s %s", code, out, stderr)
	}
	describe := func() string {
		_, out, _ := run("credential", "describe", id[1])
		return out
	}
	if d := describe(); !regexp.MustCompile(`size\s+Size\s+integer\s+3`).MatchString(d) || !regexp.MustCompile(`fast\s+Fast\s+boolean\s+true`).MatchString(d) {
		t.Errorf("describe after add:\n%s", d)
	}

	code, out, stderr = run("credential", "update", id[1], "--field", "size=4")
	if code != 0 || !strings.Contains(out, "updated credential "+id[1]+": size") {
		t.Fatalf("update: %d %s %s", code, out, stderr)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--field", "size=0"}, "schemacloud credential: field size (Size) must be at least 1 (minimum; got 0)"},
		{[]string{"--field", "nope=1"}, "unknown field nope (fields: token, zone, size, fast)"},
		{[]string{"--unset", "nope"}, "--unset: unknown field nope"},
		{nil, "nothing to change"},
		// Only kloud knows the old value: its refusal, with its code.
		{[]string{"--field", "zone=b"}, `field zone (Zone) is immutable: it cannot change from "a" to "b"`},
	} {
		code, _, stderr := run(append([]string{"credential", "update", id[1]}, c.args...)...)
		if code == 0 || !strings.Contains(stderr, c.want) {
			t.Errorf("update %v: exit %d\n%s\nwant %q", c.args, code, stderr, c.want)
		}
	}
	if code, out, stderr := run("credential", "update", id[1], "--unset", "size", "--field", "fast=false"); code != 0 || !strings.Contains(out, "fast, size") {
		t.Fatalf("update --unset: %d %s %s", code, out, stderr)
	}
	if d := describe(); !regexp.MustCompile(`size\s+Size\s+integer\s+2`).MatchString(d) || !regexp.MustCompile(`token\s+Token\s+string\s+\(secret, set\)`).MatchString(d) {
		t.Errorf("describe after the updates (size back to its default, the token kept):\n%s", d)
	}

	code, out, _ = run("provider", "describe", "schemacloud")
	for _, want := range []string{`kind: builtin`, `capabilities: info, start`, `zone\s+Zone\s+string\s+no\s+no\s+a\s+yes\s+a\|b\s+where it runs`,
		`size\s+Size\s+integer\s+no\s+no\s+2\s+no\s+1\.\.8`, `token\s+Token\s+string\s+yes\s+yes\s+-\s+no\s+>= 4 chars`} {
		if code != 0 || !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("provider describe lacks %s:\n%s", want, out)
		}
	}
}
