package cli_test

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/model"
)

// TestQuotaFromTheCLI: an administrator sets a user's and a team's quota with sizes (8G, 50G);
// `quota show` gives use, limit and what is left; a member may see its own quota and its team's
// but not set one.
func TestQuotaFromTheCLI(t *testing.T) {
	t.Parallel()
	_, run, must := startKloud(t, kloudtest.Options{})
	aliceKey := filepath.Join(t.TempDir(), "alice.key")
	alice := func(args ...string) (int, string, string) { return run(append(args, "--key", aliceKey)...) }
	must(run("user", "add", "alice", "--team", model.DefaultTeam))
	must(run("key", "create", "--username", "alice", "--out", aliceKey))

	out := must(run("quota", "set", "--user", "alice", "--machines", "3", "--cores", "4", "--memory", "8G", "--disk", "50G", "--buckets", "2", "--bucket-size", "10G"))
	for _, w := range []string{"quota of user alice", "machines", "3", "8G", "50G", "buckets", "bucket size", "10G"} {
		if !strings.Contains(out, w) {
			t.Errorf("quota set: output does not say %q:\n%s", w, out)
		}
	}
	var st api.QuotaStatus
	if err := json.Unmarshal([]byte(must(alice("quota", "show", "--json"))), &st); err != nil {
		t.Fatal(err)
	}
	want := api.QuotaStatus{Subject: "user/alice", Limit: api.Quota{Machines: 3, Cores: 4, MemoryMB: 8192, DiskMB: 51200, Buckets: 2, BucketMB: 10240},
		Left: api.Quota{Machines: 3, Cores: 4, MemoryMB: 8192, DiskMB: 51200, Buckets: 2, BucketMB: 10240}}
	if st != want {
		t.Fatalf("quota show: %+v, want %+v", st, want)
	}
	must(run("quota", "set", "--team", model.DefaultTeam, "--machines", "10"))
	out = must(alice("quota", "show", "--team", model.DefaultTeam))
	if !strings.Contains(out, "quota of team "+model.DefaultTeam) || !strings.Contains(out, "unlimited") {
		t.Errorf("quota show --team:\n%s", out)
	}
	if code, _, stderr := alice("quota", "set", "--user", "alice", "--machines", "100"); code == 0 || !strings.Contains(stderr, "administrators") {
		t.Errorf("quota set by a member: exit %d, %s", code, stderr)
	}
	if code, _, stderr := run("quota", "set", "--user", "alice", "--memory", "lots"); code == 0 || !strings.Contains(stderr, "--memory") {
		t.Errorf("quota set --memory lots: exit %d, %s", code, stderr)
	}
	if code, _, stderr := run("quota", "set", "--user", "alice", "--bucket-size", "lots"); code == 0 || !strings.Contains(stderr, "--bucket-size") {
		t.Errorf("quota set --bucket-size lots: exit %d, %s", code, stderr)
	}
}

// TestDefaultQuota: kloud serve's default quota is every user's without one (quota show says
// it); an administrator's quota replaces it, all 0 lifts it for that user.
func TestDefaultQuota(t *testing.T) {
	t.Parallel()
	_, run, must := startKloud(t, kloudtest.Options{DefaultQuota: api.Quota{Machines: 2, MemoryMB: 4096}})
	must(run("user", "add", "bob", "--team", model.DefaultTeam))
	show := func() api.QuotaStatus {
		t.Helper()
		var st api.QuotaStatus
		if err := json.Unmarshal([]byte(must(run("quota", "show", "--user", "bob", "--json"))), &st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	if st := show(); st.Limit != (api.Quota{Machines: 2, MemoryMB: 4096}) {
		t.Fatalf("bob's quota under the default: %+v", st)
	}
	must(run("quota", "set", "--user", "bob", "--machines", "5"))
	if st := show(); st.Limit != (api.Quota{Machines: 5}) {
		t.Fatalf("bob's own quota: %+v", st)
	}
	must(run("quota", "set", "--user", "bob"))
	if st := show(); st.Limit != (api.Quota{}) {
		t.Fatalf("bob's quota lifted: %+v", st)
	}
}
