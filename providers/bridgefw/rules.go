package bridgefw

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/kloud-dev/kloud/internal/atomicfile"
	"github.com/kloud-dev/kloud/provider"
)

// Rule opens Port/Protocol of a machine to From: the provider contract's rule, checked and
// normalised by its Normalize (tcp and any by default; a bare address becomes a /32); From is
// provider.FromKloud, FromOwner, FromTeam, FromAny or an IPv4 CIDR.
type Rule = provider.PortRule

// Change checks rules and returns have with them added (open; present ones are kept once) or
// removed (absent ones are ignored). have is not modified.
func Change(have, rules []Rule, open bool) ([]Rule, error) {
	out := slices.Clone(have)
	for _, r := range rules {
		if err := r.Normalize(); err != nil {
			return nil, err
		}
		i := slices.Index(out, r)
		switch {
		case open && i < 0:
			out = append(out, r)
		case !open && i >= 0:
			out = slices.Delete(out, i, i+1)
		}
	}
	return out, nil
}

// MaxRules bounds one machine's rules (a rule is a few chain rules per machine of the bridge).
const MaxRules = 256

// file is a machine's rules file.
type file struct {
	Rules []Rule `json:"rules"`
}

// Load reads a machine's rules file ({"rules": [...]}); a missing file is no rules. Rules that
// do not normalise are an error (the file is not the user's to write).
func Load(path string) ([]Rule, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("firewall: %w", err)
	}
	var f file
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("firewall: %s: %w", path, err)
	}
	for i := range f.Rules {
		if err := f.Rules[i].Normalize(); err != nil {
			return nil, fmt.Errorf("firewall: %s: %w", path, err)
		}
	}
	return f.Rules, nil
}

// Update changes a machine's rules file: its rules with rules added (open) or removed (Change),
// saved (Save; the file's directory is made, 0700, if missing). It returns the new rules. The
// caller serialises updates of one file.
func Update(path string, rules []Rule, open bool) ([]Rule, error) {
	have, err := Load(path)
	if err != nil {
		return nil, err
	}
	out, err := Change(have, rules, open)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("firewall: %w", err)
	}
	if err := Save(path, out); err != nil {
		return nil, err
	}
	return out, nil
}

// Save writes a machine's rules file atomically (0600), at most MaxRules rules.
func Save(path string, rules []Rule) error {
	if len(rules) > MaxRules {
		return fmt.Errorf("firewall: %d rules: at most %d per machine (close some first)", len(rules), MaxRules)
	}
	if rules == nil {
		rules = []Rule{}
	}
	b, err := json.MarshalIndent(file{Rules: rules}, "", "  ")
	if err != nil {
		return fmt.Errorf("firewall: %w", err)
	}
	if err := atomicfile.WriteFile(path, b, 0o600); err != nil {
		return fmt.Errorf("firewall: %w", err)
	}
	return nil
}
