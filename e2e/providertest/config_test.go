package providertest

import (
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/provider"
)

// A Config without what the suite needs is refused, naming what is missing.
func TestConfigCheck(t *testing.T) {
	full := Config{
		Provider:       &provider.Provider{Name: "x"},
		Template:       func(int) map[string]string { return nil },
		StopBehindBack: func(*testing.T, Machine) {},
		WriteFile:      func(*testing.T, Machine, string, string) {},
		ReadFile:       func(*testing.T, Machine, string) string { return "" },
		Leftovers:      func(*testing.T) []string { return nil },
	}
	if err := full.check(); err != nil {
		t.Fatalf("a complete config: %v", err)
	}
	for name, c := range map[string]struct {
		edit func(*Config)
		want string
	}{
		"neither provider nor plugin": {func(c *Config) { c.Provider = nil }, "exactly one"},
		"both":                        {func(c *Config) { c.Plugin = "/bin/kloud-provider-x"; c.Name = "x" }, "exactly one"},
		"plugin without a name":       {func(c *Config) { c.Provider, c.Plugin = nil, "/bin/kloud-provider-x" }, "Name"},
		"no hooks":                    {func(c *Config) { c.StopBehindBack, c.Leftovers = nil, nil }, "Leftovers, StopBehindBack"},
		"bad credential, no reason":   {func(c *Config) { c.BadCredential = []byte(`{}`) }, "BadReason"},
	} {
		cfg := full
		c.edit(&cfg)
		if err := cfg.check(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error about %q", name, err, c.want)
		}
	}
}
