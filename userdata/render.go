package userdata

import (
	"encoding/base64"
	"fmt"
	"path"
	"strings"
)

// Render returns the cloud-init user data for one machine: "#cloud-config\n" followed by YAML
// with sorted keys. See the package doc for what it contains and how c.UserData and c.Extra are
// merged. Errors wrap ErrInvalid (bad Config or unusable user data) or ErrMerge (conflicts).
func Render(c Config) ([]byte, error) {
	return render(c, defaultOptions())
}

// options are the knobs tests turn; production uses defaultOptions.
type options struct {
	root       string // prefix for every machine path (tests run provision.sh on the host)
	attempts   int    // download attempts
	firstDelay int    // seconds before the second attempt; doubles up to maxDelay
	maxDelay   int
}

func defaultOptions() options {
	return options{attempts: 8, firstDelay: 1, maxDelay: 30}
}

// userData is the classified Config.UserData.
type userData struct {
	script []byte         // a script to run after klient starts
	shell  string         // "/bin/bash" when script has no #! line
	config map[string]any // a parsed #cloud-config
}

// Prefixes cloud-init gives a meaning we cannot honour inside one #cloud-config, longest first
// where one is a prefix of another. Compared lower-case after leading whitespace is dropped, as
// cloud-init does.
var unsupportedPrefixes = []struct{ prefix, what string }{
	{"#cloud-config-archive", "a cloud-config archive"},
	{"#cloud-config-jsonp", "a cloud-config JSON patch"},
	{"#include-once", "an include list"},
	{"#include", "an include list"},
	{"#cloud-boothook", "a boothook"},
	{"#part-handler", "a part handler"},
	{"#upstart-job", "an upstart job"},
	{"## template: jinja", "a jinja template"},
	{"content-type:", "MIME multipart user data"},
	{"mime-version:", "MIME multipart user data"},
}

func classify(s string) (userData, error) {
	if strings.HasPrefix(s, "\x1f\x8b") {
		return userData{}, fmt.Errorf("user data is gzip-compressed; give it uncompressed: %w", ErrInvalid)
	}
	trimmed := strings.TrimLeft(s, " \t\r\n")
	if trimmed == "" {
		return userData{}, nil
	}
	lower := strings.ToLower(trimmed)
	for _, u := range unsupportedPrefixes {
		if strings.HasPrefix(lower, u.prefix) {
			return userData{}, fmt.Errorf("user data is %s (%q); kloud supports a script or one #cloud-config document: %w", u.what, trimmed[:len(u.prefix)], ErrInvalid)
		}
	}
	if strings.HasPrefix(lower, "#cloud-config") {
		cfg, err := decodeCloudConfig([]byte(trimmed))
		if err != nil {
			return userData{}, fmt.Errorf("user data: %w", err)
		}
		for _, k := range []string{"merge_how", "merge_type"} {
			if _, ok := cfg[k]; ok {
				return userData{}, fmt.Errorf("user data sets %s; kloud merges with fixed rules (see package userdata): %w", k, ErrInvalid)
			}
		}
		return userData{config: cfg}, nil
	}
	if strings.HasPrefix(trimmed, "#!") {
		return userData{script: []byte(trimmed)}, nil
	}
	return userData{script: []byte(s), shell: "/bin/bash"}, nil
}

// reservedDirs are kloud's own; Extra and the user may not write files there.
var reservedDirs = []string{"/etc/kloud", "/var/lib/kloud", "/opt/kloud", "/var/log/kloud", "/run/kloud"}

// checkReserved rejects write_files entries of an overlay (Extra or the user's config) that
// would replace kloud's files.
func checkReserved(cfg map[string]any, who string) error {
	files, ok := cfg["write_files"].([]any)
	if !ok {
		return nil
	}
	for i, f := range files {
		m, ok := f.(map[string]any)
		if !ok {
			continue
		}
		p, ok := m["path"].(string)
		if !ok {
			continue
		}
		clean := path.Clean("/" + p)
		reserved := clean == KlientUnitPath || clean == PerBootScriptPath
		for _, d := range reservedDirs {
			if clean == d || strings.HasPrefix(clean, d+"/") {
				reserved = true
			}
		}
		if reserved {
			return &MergeError{Path: fmt.Sprintf("write_files[%d].path", i), Overlay: p, Reason: who + " may not write kloud's own files"}
		}
	}
	return nil
}

func newScriptData(c Config, ud userData, p paths, o options) scriptData {
	d := scriptData{
		Owner: c.Username, KontrolURL: c.KontrolURL, KlientURL: c.KlientURL, KlientSHA256: c.KlientSHA256,
		KiteKey: p.at(KiteKeyPath), KlientBin: p.at(KlientPath),
		LogDir: p.at("/var/log/kloud"), StateDir: p.at("/var/lib/kloud"), RunDir: p.at("/run/kloud"),
		ProvisionLog: p.at(ProvisionLogPath), KlientLog: p.at(KlientLogPath), UserScriptLog: p.at(UserScriptLogPath),
		ProvisionStatus: p.at(ProvisionStatusPath), UserScriptStatus: p.at(UserScriptStatusPath),
		RunKlient: p.at(RunKlientPath), StartKlient: p.at(StartKlientPath), PIDFile: p.at(SupervisorPIDPath),
		PerBoot: p.at(PerBootScriptPath), PerBootDir: p.at(path.Dir(PerBootScriptPath)),
		SystemdDir: p.at("/run/systemd/system"), UnitDir: p.at(path.Dir(KlientUnitPath)), UnitFile: p.at(KlientUnitPath), Unit: KlientUnit,
		Attempts: o.attempts, FirstDelay: o.firstDelay, MaxDelay: o.maxDelay,
	}
	if ud.script != nil {
		d.UserScript, d.UserScriptShell = p.at(UserScriptPath), ud.shell
	}
	if c.CACert != "" {
		d.CACert = p.at(CACertPath)
	}
	return d
}

func render(c Config, o options) ([]byte, error) {
	c, err := c.validate()
	if err != nil {
		return nil, err
	}
	ud, err := classify(c.UserData)
	if err != nil {
		return nil, err
	}
	p := paths{root: o.root}
	d := newScriptData(c, ud, p, o)
	script, err := renderProvision(d)
	if err != nil {
		return nil, err
	}

	files := []any{
		map[string]any{"path": p.at(KiteKeyPath), "content": c.KiteKey, "owner": "root:root", "permissions": "0400"},
		map[string]any{"path": p.at(ProvisionScriptPath), "content": script, "owner": "root:root", "permissions": "0755"},
	}
	if c.CACert != "" {
		files = append(files, map[string]any{"path": p.at(CACertPath), "content": c.CACert, "owner": "root:root", "permissions": "0644"})
	}
	if ud.script != nil {
		files = append(files, map[string]any{
			"path": p.at(UserScriptPath), "encoding": "b64", "content": base64.StdEncoding.EncodeToString(ud.script),
			"owner": "root:root", "permissions": "0755",
		})
	}
	base := map[string]any{
		"output": map[string]any{"all": "| tee -a " + CloudInitOutputPath},
		"users": []any{map[string]any{
			"name": c.Username, "gecos": OwnerGecos, "shell": "/bin/bash",
			"lock_passwd": true, "sudo": "ALL=(ALL) NOPASSWD:ALL",
		}},
		"write_files": files,
		"runcmd":      []any{[]any{p.at(ProvisionScriptPath)}},
	}
	if c.Hostname != "" {
		base["hostname"] = c.Hostname
	}

	if len(c.Extra) > 0 {
		n, err := normalize(c.Extra, "")
		if err != nil {
			return nil, fmt.Errorf("extra: %w", err)
		}
		extra, _ := n.(map[string]any)
		if err := checkReserved(extra, "extra"); err != nil {
			return nil, fmt.Errorf("extra: %w", err)
		}
		if base, err = Merge(base, extra); err != nil {
			return nil, fmt.Errorf("extra: %w", err)
		}
	}
	if ud.config != nil {
		if err := checkReserved(ud.config, "user data"); err != nil {
			return nil, fmt.Errorf("user data: %w", err)
		}
		if base, err = Merge(base, ud.config); err != nil {
			return nil, fmt.Errorf("user data: %w", err)
		}
	}
	return encodeCloudConfig(base)
}
