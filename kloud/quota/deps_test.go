package quota_test

import (
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
)

// TestDependencies keeps the quotas below the orchestrator: kloud/quota reads kloud's store
// through kloud/store's repositories and the providers' registry, never imports kloud (or its
// CLI or UI), and links no kontrol, terraformer engine or plugin host.
func TestDependencies(t *testing.T) {
	t.Parallel()
	const mod = "github.com/kloud-dev/kloud/"
	for _, dep := range testutil.Deps(t, "./kloud/quota") {
		p, ours := strings.CutPrefix(dep, mod)
		if !ours {
			continue
		}
		switch {
		case p == "kloud/quota", p == "kloud/model", p == "kloud/api", p == "kloud/store":
		case p == "kloud" || strings.HasPrefix(p, "kloud/"):
			t.Errorf("kloud/quota links %s (it gets what it needs of kloud through quota.Options)", dep)
		case p == "kontrol" || strings.HasPrefix(p, "kontrol/") && p != "kontrol/kontrolapi",
			strings.HasPrefix(p, "terraformer") && p != "terraformer/tfapi",
			strings.HasPrefix(p, "provider/plugin") && p != "provider/pluginapi":
			t.Errorf("kloud/quota links %s", dep)
		}
	}
}
