package sandbox

import (
	"strings"
	"testing"
)

func TestMeminfo(t *testing.T) {
	host := `MemTotal:       24684020 kB
MemFree:        21200000 kB
MemAvailable:     204800 kB
Buffers:          100000 kB
Cached:          3000000 kB
SwapTotal:       1000000 kB
HugePages_Total:       0
Hugepagesize:       2048 kB
`
	got := string(MemInfo([]byte(host), 300<<10))
	for _, want := range []string{"MemTotal:         307200 kB", "MemFree:          307200 kB", "MemAvailable:     204800 kB", "Cached:                0 kB", "SwapTotal:             0 kB"} {
		if !strings.Contains(got, want) {
			t.Errorf("meminfo has no %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "HugePages_Total") || strings.Contains(got, "Hugepagesize") {
		t.Errorf("meminfo keeps the host's huge pages:\n%s", got)
	}
}
