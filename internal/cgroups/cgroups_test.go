package cgroups

import "testing"

// The guard stands between a bad name and killing or deleting host-wide things (a hierarchy's
// root group lists every process on the host). No root needed.
func TestValid(t *testing.T) {
	for _, rel := range []string{"", "kloud", "kloud/", "/kloud/tf-a", "kloud/a/b", "kloud/..", "kloud/a..b", "tf-a", "../kloud/tf-a"} {
		if Valid(rel) {
			t.Errorf("Valid(%q) = true", rel)
		}
		if d := Dirs(map[string]Hierarchy{"pids": {Mount: "/sys/fs/cgroup/pids"}}, rel); len(d) != 0 {
			t.Errorf("Dirs(%q) = %v", rel, d)
		}
	}
	for _, rel := range []string{"kloud/tf-0123abcd", "kloud/kp-plugin-x-01", "kloud/kd-0a1b2c-0123456789"} {
		if !Valid(rel) {
			t.Errorf("Valid(%q) = false", rel)
		}
	}
	hs := map[string]Hierarchy{"pids": {Mount: "/sys/fs/cgroup/pids"}, "memory": {Mount: "/sys/fs/cgroup/unified", V2: true}, "cpu": {Mount: "/sys/fs/cgroup/unified", V2: true}}
	if d := Dirs(hs, "kloud/tf-a"); len(d) != 2 {
		t.Errorf("Dirs over two hierarchies = %v, want one per distinct mount", d)
	}
}

func TestParseMountinfo(t *testing.T) {
	mp, fstype, opts, ok := ParseMountinfo(`36 25 0:31 / /sys/fs/cgroup/my\040pids rw,nosuid shared:16 - cgroup cgroup rw,pids`)
	if !ok || mp != "/sys/fs/cgroup/my pids" || fstype != "cgroup" || opts != "rw,pids" {
		t.Errorf("ParseMountinfo = %q %q %q %v", mp, fstype, opts, ok)
	}
	if _, _, _, ok := ParseMountinfo("garbage"); ok {
		t.Error("a line without ' - ' parsed")
	}
}
