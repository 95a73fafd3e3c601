package providertest

import (
	"strings"
	"testing"
)

// The file the user script of Config.UserScriptTemplate writes, and what it writes there.
const (
	userScriptPath = "kloud-user-script.txt"
	userScriptData = "written by the template's own user script"
)

// stackTemplate is the template of the suite's stack: Config.UserScriptTemplate's when set.
func (s *suite) stackTemplate() map[string]string { return s.templateOf(2) }

// templateOf is the template of n machines in the family the stack was built from (with the
// user script when the provider tests one), so that a later revision changes only the count.
func (s *suite) templateOf(n int) map[string]string {
	if s.c.UserScriptTemplate != nil {
		return s.c.UserScriptTemplate(n, userScriptPath, userScriptData)
	}
	return s.c.Template(n)
}

// UserScript: the template author's own user data ran on every machine of the stack (kloud
// merged it with its own cloud-init; it runs after the agent started, and the build waits for
// the end of provisioning).
func (s *suite) testUserScript(t *testing.T) {
	if s.c.UserScriptTemplate == nil {
		t.Skip("Config.UserScriptTemplate is not set: the provider's own user data is not tested")
	}
	s.needStack(t)
	for _, m := range s.machines {
		if got := strings.TrimSpace(s.c.ReadFile(t, m, userScriptPath)); got != userScriptData {
			t.Errorf("machine %s: %s holds %q after the build, want %q from the template's user script", m.Label, userScriptPath, got, userScriptData)
		}
	}
}
