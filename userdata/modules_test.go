package userdata

import (
	"slices"
	"testing"

	"gopkg.in/yaml.v3"
)

// TestModuleLists checks the module lists the local sandbox and klient --vagrant write into
// /etc/cloud/cloud.cfg.d: valid cloud-config for the host's cloud-init, the three lists, and the
// host name's modules only when asked for.
func TestModuleLists(t *testing.T) {
	for _, hostname := range []bool{false, true} {
		out := ModuleLists(hostname)
		cloudInitSchema(t, []byte("#cloud-config\n"+out))
		var lists map[string][]string
		if err := yaml.Unmarshal([]byte(out), &lists); err != nil {
			t.Fatalf("hostname=%v: %v\n%s", hostname, err, out)
		}
		for _, k := range []string{"cloud_init_modules", "cloud_config_modules", "cloud_final_modules"} {
			if len(lists[k]) == 0 {
				t.Errorf("hostname=%v: no %s:\n%s", hostname, k, out)
			}
		}
		init := lists["cloud_init_modules"]
		for _, m := range []string{"set_hostname", "update_hostname", "update_etc_hosts"} {
			if slices.Contains(init, m) != hostname {
				t.Errorf("hostname=%v: cloud_init_modules %v, %s in it: %v", hostname, init, m, !hostname)
			}
		}
		for _, m := range []string{"write-files", "users-groups", "runcmd", "scripts-user", "final-message"} {
			if !slices.Contains(slices.Concat(init, lists["cloud_config_modules"], lists["cloud_final_modules"]), m) {
				t.Errorf("hostname=%v: %s missing (the user data needs it)", hostname, m)
			}
		}
	}
}
