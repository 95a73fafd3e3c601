package userdata

import (
	"bytes"
	"encoding/base64"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current output")

// goldenCases are rendered, compared with testdata/<name>.golden and validated by cloud-init.
var goldenCases = []struct {
	name string
	cfg  func() Config
}{
	{"plain", baseConfig},
	{"no-hostname", func() Config { c := baseConfig(); c.Hostname = ""; return c }},
	{"script", func() Config {
		c := baseConfig()
		c.UserData = "#!/bin/bash\nset -e\napt-get install -y htop\necho 'done' > /tmp/marker\n"
		return c
	}},
	{"script-no-shebang", func() Config {
		c := baseConfig()
		c.UserData = "echo hello from $KLOUD_OWNER\n"
		return c
	}},
	{"cloud-config", func() Config {
		c := baseConfig()
		c.UserData = `#cloud-config
package_update: yes
packages: [htop, git]
users:
  - name: alice
    groups: [docker]
    ssh_authorized_keys: ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBVHTyGPWNsFqAKm2qZ+6sWfBwXygRmPmsmHcsE4Zbk4 alice@laptop"]
  - name: bob
    shell: /bin/sh
write_files:
  - path: /etc/motd
    content: |
      Welcome to alice's machine.
    permissions: '0644'
runcmd:
  - echo user runcmd runs after provision.sh
  - [touch, /tmp/user-was-here]
`
		return c
	}},
	{"extra", func() Config {
		c := baseConfig()
		c.Extra = map[string]any{
			"locale":   "C.UTF-8",
			"timezone": "UTC",
			"users":    []string{"default"},
			"bootcmd":  [][]string{{"mkdir", "-p", "/run/provider"}},
		}
		c.UserData = "#cloud-config\nruncmd:\n  - echo from user\n"
		return c
	}},
}

func TestRenderGolden(t *testing.T) {
	for _, tc := range goldenCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out, err := Render(tc.cfg())
			if err != nil {
				t.Fatalf("Render: %v", err)
			}
			again, err := Render(tc.cfg())
			if err != nil || !bytes.Equal(out, again) {
				t.Fatalf("Render is not deterministic (err %v)", err)
			}
			provisionOf(t, out) // bash -n
			golden := filepath.Join("testdata", tc.name+".golden")
			if *update {
				if err := os.WriteFile(golden, out, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test ./userdata -run TestRenderGolden -update)", err)
			}
			if !bytes.Equal(out, want) {
				t.Errorf("output differs from %s (run with -update if intended):\n%s", golden, out)
			}
			cloudInitSchema(t, out)
		})
	}
}

// TestRenderContract checks the parts of the output other packages rely on.
func TestRenderContract(t *testing.T) {
	c := baseConfig()
	c.UserData = "  \n#!/usr/bin/env python3\nprint('hi')\n"
	out, err := Render(c)
	if err != nil {
		t.Fatal(err)
	}
	cfg := parseRendered(t, out)
	script := provisionOf(t, out)

	key := writeFile(t, cfg, KiteKeyPath)
	if key == nil || key["content"] != testKiteKey || key["permissions"] != "0400" || key["owner"] != "root:root" {
		t.Errorf("kite key entry = %v", key)
	}
	prov := writeFile(t, cfg, ProvisionScriptPath)
	if prov["permissions"] != "0755" {
		t.Errorf("provision.sh permissions = %v", prov["permissions"])
	}
	us := writeFile(t, cfg, UserScriptPath)
	if us == nil || us["permissions"] != "0755" || us["encoding"] != "b64" {
		t.Fatalf("user script entry = %v", us)
	}
	raw, err := base64.StdEncoding.DecodeString(us["content"].(string))
	if err != nil || string(raw) != "#!/usr/bin/env python3\nprint('hi')\n" {
		t.Errorf("user script = %q, %v (leading blank lines before #! must be dropped)", raw, err)
	}
	if !reflect.DeepEqual(cfg["runcmd"], []any{[]any{ProvisionScriptPath}}) {
		t.Errorf("runcmd = %#v", cfg["runcmd"])
	}
	users := cfg["users"].([]any)
	owner := users[0].(map[string]any)
	if len(users) != 1 || owner["name"] != "alice" || owner["sudo"] != "ALL=(ALL) NOPASSWD:ALL" ||
		owner["lock_passwd"] != true || owner["shell"] != "/bin/bash" {
		t.Errorf("users = %#v", users)
	}
	if cfg["hostname"] != "alice-vm-1" {
		t.Errorf("hostname = %v", cfg["hostname"])
	}
	for _, want := range []string{
		"curl --fail", "--connect-timeout 10", "sha256sum", "kloud-klient.service", "Restart=always",
		"setsid nohup", "--kite-key /etc/kloud/kite.key --kontrol-url http://10.200.0.1:7000/kite",
		"user_script=/var/lib/kloud/user-script.sh", "user_script_shell=''",
	} {
		if !strings.Contains(script, want) {
			t.Errorf("provision.sh lacks %q", want)
		}
	}
	if strings.Contains(script, "--location") || strings.Contains(script, " -L ") {
		t.Error("provision.sh must not follow redirects")
	}
}

func TestRenderShellQuoting(t *testing.T) {
	c := baseConfig()
	c.KontrolURL = "http://127.0.0.1:9/kite?q='$(touch${IFS}pwned)';x=$HOME&y=\"z\"`id`"
	out, err := Render(c)
	if err != nil {
		t.Fatal(err)
	}
	script := provisionOf(t, out)
	want := `kontrol_url='http://127.0.0.1:9/kite?q='\''$(touch${IFS}pwned)'\'';x=$HOME&y="z"` + "`id`'"
	if !strings.Contains(script, want) {
		t.Errorf("kontrol URL not single-quoted; want %s in\n%s", want, script)
	}
	cloudInitSchema(t, out)
}

func TestRenderYAML11(t *testing.T) {
	c := baseConfig()
	c.UserData = "#cloud-config\npackage_upgrade: yes\nssh_pwauth: off\nx_date: 2024-01-02\nx_quoted: 'yes'\nx_octal: 0644\n"
	out, err := Render(c)
	if err != nil {
		t.Fatal(err)
	}
	cfg := parseRendered(t, out)
	for k, want := range map[string]any{"package_upgrade": true, "ssh_pwauth": false, "x_date": "2024-01-02", "x_quoted": "yes", "x_octal": 420} {
		if !reflect.DeepEqual(cfg[k], want) {
			t.Errorf("%s = %#v, want %#v", k, cfg[k], want)
		}
	}
}

func TestRenderErrors(t *testing.T) {
	tests := []struct {
		name     string
		mod      func(*Config)
		sentinel error
		contains string
	}{
		{"no username", func(c *Config) { c.Username = "" }, ErrInvalid, "username is required"},
		{"bad username", func(c *Config) { c.Username = "Alice" }, ErrInvalid, `username "Alice"`},
		{"username with quote", func(c *Config) { c.Username = "a'b" }, ErrInvalid, "username"},
		{"root", func(c *Config) { c.Username = "root" }, ErrInvalid, "system account"},
		{"long username", func(c *Config) { c.Username = strings.Repeat("a", 33) }, ErrInvalid, "longer than 32"},
		{"bad hostname", func(c *Config) { c.Hostname = "-bad" }, ErrInvalid, "hostname"},
		{"hostname underscore", func(c *Config) { c.Hostname = "a_b" }, ErrInvalid, "hostname"},
		{"no kite key", func(c *Config) { c.KiteKey = "" }, ErrInvalid, "kite key is required"},
		{"kite key not jwt", func(c *Config) { c.KiteKey = "abc\ndef" }, ErrInvalid, "compact JWT"},
		{"kontrol scheme", func(c *Config) { c.KontrolURL = "ws://10.200.0.1:7000/kite" }, ErrInvalid, "kontrol URL"},
		{"klient missing", func(c *Config) { c.KlientURL = "" }, ErrInvalid, "klient URL is required"},
		{"klient no host", func(c *Config) { c.KlientURL = "http:///dl/klient" }, ErrInvalid, "no host"},
		{"klient space", func(c *Config) { c.KlientURL = "http://h/a b" }, ErrInvalid, "whitespace"},
		{"sha short", func(c *Config) { c.KlientSHA256 = "abc" }, ErrInvalid, "64 hex"},
		{"sha not hex", func(c *Config) { c.KlientSHA256 = strings.Repeat("g", 64) }, ErrInvalid, "64 hex"},
		{"include", func(c *Config) { c.UserData = "#include\nhttp://x/y\n" }, ErrInvalid, "include"},
		{"include-once", func(c *Config) { c.UserData = "#include-once\nhttp://x/y\n" }, ErrInvalid, "include"},
		{"boothook", func(c *Config) { c.UserData = "#cloud-boothook\n#!/bin/sh\n" }, ErrInvalid, "boothook"},
		{"archive", func(c *Config) { c.UserData = "#cloud-config-archive\n- type: foo\n" }, ErrInvalid, "archive"},
		{"jinja", func(c *Config) { c.UserData = "## template: jinja\n#cloud-config\n" }, ErrInvalid, "jinja"},
		{"mime", func(c *Config) {
			c.UserData = "Content-Type: multipart/mixed; boundary=\"x\"\nMIME-Version: 1.0\n\n--x\n"
		}, ErrInvalid, "MIME"},
		{"gzip", func(c *Config) { c.UserData = "\x1f\x8b\x08\x00" }, ErrInvalid, "gzip"},
		{"bad yaml", func(c *Config) { c.UserData = "#cloud-config\nfoo: [\n" }, ErrInvalid, "parse #cloud-config"},
		{"top-level list", func(c *Config) { c.UserData = "#cloud-config\n- a\n- b\n" }, ErrInvalid, "top level"},
		{"merge_how", func(c *Config) { c.UserData = "#cloud-config\nmerge_how: 'list()+dict()+str()'\n" }, ErrInvalid, "merge_how"},
		{"user overrides sudo", func(c *Config) {
			c.UserData = "#cloud-config\nusers:\n  - name: alice\n    sudo: false\n"
		}, ErrMerge, "users[name=alice].sudo"},
		{"user overrides hostname", func(c *Config) { c.UserData = "#cloud-config\nhostname: other\n" }, ErrMerge, `hostname: conflicting values: base "alice-vm-1", overlay "other"`},
		{"user writes kite key", func(c *Config) {
			c.UserData = "#cloud-config\nwrite_files:\n  - path: /etc/kloud/kite.key\n    content: x\n"
		}, ErrMerge, "kloud's own files"},
		{"user writes under kloud dir", func(c *Config) {
			c.UserData = "#cloud-config\nwrite_files:\n  - path: /var/lib/../lib/kloud/other\n    content: x\n"
		}, ErrMerge, "write_files[0].path"},
		{"user writes unit", func(c *Config) {
			c.UserData = "#cloud-config\nwrite_files:\n  - path: /etc/systemd/system/kloud-klient.service\n    content: x\n"
		}, ErrMerge, "kloud's own files"},
		{"user runcmd as string", func(c *Config) { c.UserData = "#cloud-config\nruncmd: echo hi\n" }, ErrMerge, "runcmd"},
		{"extra writes kloud file", func(c *Config) {
			c.Extra = map[string]any{"write_files": []map[string]any{{"path": "/opt/kloud/bin/klient", "content": "x"}}}
		}, ErrMerge, "extra"},
		{"extra vs user", func(c *Config) {
			c.Extra = map[string]any{"locale": "C.UTF-8"}
			c.UserData = "#cloud-config\nlocale: de_DE.UTF-8\n"
		}, ErrMerge, "locale"},
		{"extra bad value", func(c *Config) { c.Extra = map[string]any{"x": func() {}} }, ErrInvalid, "x: a func()"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := baseConfig()
			tc.mod(&c)
			out, err := Render(c)
			if err == nil {
				t.Fatalf("Render succeeded, want an error:\n%s", out)
			}
			if !errors.Is(err, tc.sentinel) {
				t.Errorf("error %q does not wrap %v", err, tc.sentinel)
			}
			if !strings.Contains(err.Error(), tc.contains) {
				t.Errorf("error %q does not mention %q", err, tc.contains)
			}
		})
	}
}

func TestRenderAcceptsValidInputs(t *testing.T) {
	for _, mod := range []func(*Config){
		func(c *Config) { c.Username = "_svc-1" },
		func(c *Config) { c.Hostname = "vm1.example.internal" },
		func(c *Config) { c.KlientSHA256 = strings.ToUpper(testSHA) },
		func(c *Config) { c.KlientURL = "https://kloud.example/dl/klient?v=2" },
		func(c *Config) { c.UserData = "   " },
		func(c *Config) { c.UserData = "#cloud-config\n" },
		func(c *Config) { c.UserData = "#Cloud-Config\n# nothing but a comment\n" },
		func(c *Config) {
			c.UserData = "#cloud-config\nusers:\n  - name: alice\n    sudo: ALL=(ALL) NOPASSWD:ALL\n"
		},
	} {
		c := baseConfig()
		mod(&c)
		out, err := Render(c)
		if err != nil {
			t.Errorf("Render(%+v): %v", c, err)
			continue
		}
		provisionOf(t, out)
		if strings.EqualFold(c.KlientSHA256, testSHA) && !bytes.Contains(out, []byte("klient_sha256="+testSHA)) {
			t.Errorf("sha256 not normalised to lower case")
		}
	}
}
