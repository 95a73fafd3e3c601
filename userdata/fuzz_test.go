package userdata

import (
	"errors"
	"strings"
	"testing"
)

// FuzzRender renders a template author's user data (a script or a #cloud-config merged with
// kloud's, the cloud-config merge) whatever it holds. Either Render refuses it with an error
// wrapping ErrInvalid or ErrMerge, or the result is a #cloud-config that parses and still carries
// kloud's own parts unchanged: the owner with passwordless sudo first in users, the agent key
// (0400 root:root) and provision.sh, run first. No user data may drop or replace them.
func FuzzRender(f *testing.F) {
	for _, c := range goldenCases {
		f.Add(c.cfg().UserData)
	}
	for _, s := range []string{
		"#cloud-config\nusers: [{name: alice, sudo: false}]\n",
		"#cloud-config\nwrite_files: [{path: /etc/kloud/kite.key, content: x}]\n",
		"#cloud-config\nwrite_files: [{path: /etc/kloud/../kloud/kite.key, content: x}]\n",
		"#cloud-config\nruncmd: null\nusers: null\n",
		"#cloud-config\nusers: {name: alice}\n",
		"#cloud-config\n&a [*a]\n",
		"#cloud-config\na: &a [*a, *a]\nb: *a\n",
		"#cloud-config\nhostname: evil\nfqdn: evil.example\n",
		"#cloud-config\nbootcmd: [[rm, -rf, /etc/kloud]]\n",
		"#cloud-config\n!!binary x: 1\n",
		"#cloud-config\n? [a, b]\n: c\n",
		"#cloud-config\nusers: [alice, {name: ALICE}]\n",
		"#include\nhttp://example.com\n",
		"\x1f\x8b",
		"#!/bin/sh\nexit 1\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, userData string) {
		c := baseConfig()
		c.UserData = userData
		out, err := Render(c)
		if err != nil {
			if !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrMerge) {
				t.Fatalf("Render refused %q with %v, which wraps neither ErrInvalid nor ErrMerge", userData, err)
			}
			return
		}
		cfg := parseRendered(t, out)
		key := writeFile(t, cfg, KiteKeyPath)
		if key == nil || key["content"] != testKiteKey || key["permissions"] != "0400" || key["owner"] != "root:root" {
			t.Errorf("user data %q: kite key entry = %v", userData, key)
		}
		keys := 0
		files, _ := cfg["write_files"].([]any)
		for _, f := range files {
			m, _ := f.(map[string]any)
			if p, _ := m["path"].(string); strings.Contains(p, "kite.key") || strings.Contains(p, ProvisionScriptPath) {
				keys++
			}
		}
		if keys != 2 {
			t.Errorf("user data %q: %d write_files entries name kloud's key or provision.sh, want 2: %v", userData, keys, files)
		}
		run, _ := cfg["runcmd"].([]any)
		if len(run) == 0 {
			t.Fatalf("user data %q: runcmd = %#v", userData, cfg["runcmd"])
		}
		if first, _ := run[0].([]any); len(first) != 1 || first[0] != ProvisionScriptPath {
			t.Errorf("user data %q: runcmd starts with %#v, not provision.sh", userData, run[0])
		}
		users, _ := cfg["users"].([]any)
		if len(users) == 0 {
			t.Fatalf("user data %q: users = %#v", userData, cfg["users"])
		}
		owner, _ := users[0].(map[string]any)
		if owner["name"] != "alice" || owner["sudo"] != "ALL=(ALL) NOPASSWD:ALL" || owner["lock_passwd"] != true {
			t.Errorf("user data %q: first user = %#v", userData, users[0])
		}
	})
}
