package sandbox

import (
	"os"
	"testing"

	"github.com/kloud-dev/kloud/internal/cgroups"

	"golang.org/x/sys/unix"
)

// The guards stand between a bad name and killing or deleting host-wide things (the root cgroup
// lists every process on the host). They need no root.
func TestGuards(t *testing.T) {
	for _, rel := range []string{"", "kloud", "kloud/", "kloud/kd-", "kd-x", "kloud/other", "kloud/kd-a/b", "kloud/kd-..", "/kloud/kd-a"} {
		if validMachineCgroup(rel) {
			t.Errorf("validMachineCgroup(%q) = true", rel)
		}
		if d := cgroupDirs(map[string]cgroups.Hierarchy{"pids": {Mount: "/sys/fs/cgroup/pids"}}, rel); len(d) != 0 {
			t.Errorf("cgroupDirs(%q) = %v", rel, d)
		}
	}
	if !validMachineCgroup("kloud/kd-0a1b2c-0123456789") {
		t.Error("a real machine cgroup is refused")
	}
	for _, n := range []string{"", "kd-", "eth0", "kd-a/../x", "kd-a.b"} {
		if validNetns(n) {
			t.Errorf("validNetns(%q) = true", n)
		}
	}
	for _, n := range []string{"", "kdh", "eth0", "kd-br0", "kdh0123456789abcd"} {
		if validVeth(n) {
			t.Errorf("validVeth(%q) = true", n)
		}
	}
	for _, pid := range []int{-1, 0, 1, os.Getpid()} {
		if err := kill(pid, unix.Signal(0)); err == nil {
			t.Errorf("kill(%d) was not refused", pid)
		}
	}
	own, err := nsInode("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	if pids := pidsInNetns(own); len(pids) != 0 {
		t.Errorf("pidsInNetns(own netns) = %v", pids)
	}
	if len(cgroupPIDs("")) != 0 || len(cgroupPIDs("kloud")) != 0 {
		t.Error("cgroupPIDs of a non-machine cgroup is not empty")
	}
}
