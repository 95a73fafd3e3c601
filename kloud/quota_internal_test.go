package kloud

import (
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/provider"
)

// TestMachineNeed: a machine's cores, memory and disk are read from the attributes its
// provider's constraints vocabulary names (here "vcpus", "ram_mb", "rootfs"); without a
// vocabulary from cpus or cores, memory and disk_mb; numbers as a plan or the store gives them.
func TestMachineNeed(t *testing.T) {
	t.Parallel()
	reg := provider.NewRegistry()
	reg.Register(&provider.Provider{Name: "vocab", ResourceType: "vocab_machine", Constraints: func() []provider.Constraint {
		return []provider.Constraint{
			{Name: provider.ConstraintCores, Attribute: "vcpus", Type: provider.ConstraintNumber},
			{Name: provider.ConstraintMem, Attribute: "ram_mb", Type: provider.ConstraintInteger},
			{Name: provider.ConstraintDisk, Attribute: "rootfs", Type: provider.ConstraintInteger},
		}
	}})
	reg.Register(&provider.Provider{Name: "plain", ResourceType: "plain_machine"})
	s := &Server{providers: reg}
	s.quota = newQuotaKeeper(s)
	for _, c := range []struct {
		provider string
		attrs    map[string]any
		want     api.Quota
	}{
		{"vocab", map[string]any{"vcpus": 1.5, "ram_mb": float64(2048), "rootfs": int64(10240), "cpus": 8, "memory": 1}, api.Quota{Machines: 1, Cores: 1.5, MemoryMB: 2048, DiskMB: 10240}},
		{"plain", map[string]any{"cpus": int32(2), "memory": "512", "disk_mb": 4096}, api.Quota{Machines: 1, Cores: 2, MemoryMB: 512, DiskMB: 4096}},
		{"plain", map[string]any{"cores": 4}, api.Quota{Machines: 1, Cores: 4}},
		{"gone", nil, api.Quota{Machines: 1}},
	} {
		if got := s.quotas().Need(c.provider, c.attrs); got != c.want {
			t.Errorf("%s %v: %+v, want %+v", c.provider, c.attrs, got, c.want)
		}
	}
}

// TestQuotaExceeded: the refusal names every limit exceeded with its use and the request; what
// fits, or has no limit, is no refusal.
func TestQuotaExceeded(t *testing.T) {
	t.Parallel()
	limit := api.Quota{Machines: 4, Cores: 4, MemoryMB: 4096}
	if err := quotaExceeded("user/bob", limit, api.Quota{Machines: 2, Cores: 2, MemoryMB: 2048, DiskMB: 1 << 20}, api.Quota{Machines: 2, Cores: 2, MemoryMB: 2048}, api.Quota{}); err != nil {
		t.Fatalf("a request that fits exactly: %v", err)
	}
	// A stack over a lowered quota scales down: it asks for less than it holds.
	if err := quotaExceeded("user/bob", limit, api.Quota{Machines: 4}, api.Quota{Machines: 2}, api.Quota{Machines: 3}); err != nil {
		t.Fatalf("a scale down over the quota: %v", err)
	}
	if err := quotaExceeded("user/bob", limit, api.Quota{Machines: 4}, api.Quota{Machines: 4}, api.Quota{Machines: 3}); err == nil {
		t.Fatal("a scale up over the quota: no refusal")
	}
	err := quotaExceeded("team/dev", limit, api.Quota{Machines: 3, Cores: 3.5, MemoryMB: 1024}, api.Quota{Machines: 1, Cores: 1, MemoryMB: 4096}, api.Quota{})
	if err == nil {
		t.Fatal("over cores and memory: no refusal")
	}
	for _, w := range []string{"quota of team dev exceeded", "cores: the limit is 4, 3.5 in use, this asks for 1", "memory: the limit is 4096 MB, 1024 MB in use, this asks for 4096 MB", "kloud quota set --team dev"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%q does not say %q", err, w)
		}
	}
	if strings.Contains(err.Error(), "machines:") {
		t.Errorf("%q names machines, which fit", err)
	}
}

// TestParseQuota reads kloud serve's --default-quota.
func TestParseQuota(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]api.Quota{
		"machines=3": {Machines: 3},
		"machines=3,cores=2.5,memory=8G,disk=50G": {Machines: 3, Cores: 2.5, MemoryMB: 8192, DiskMB: 51200},
		" memory = 512 , disk=1TiB":               {MemoryMB: 512, DiskMB: 1 << 20},
		"buckets=3,bucketBytes=10G":               {Buckets: 3, BucketMB: 10240},
		"":                                        {},
	} {
		got, err := ParseQuota(in)
		if err != nil || got != want {
			t.Errorf("ParseQuota(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, in := range []string{"machines=-1", "cores=x", "memory=8X", "gpus=1", "machines", "buckets=-1", "bucketBytes=x"} {
		if q, err := ParseQuota(in); err == nil {
			t.Errorf("ParseQuota(%q) = %+v, no error", in, q)
		}
	}
}
