package userdata

import "strings"

// ModuleLists returns cloud-init's module lists (cloud_init_modules, cloud_config_modules,
// cloud_final_modules, as YAML for a file of /etc/cloud/cloud.cfg.d) for a machine that is not a
// VM: Debian's 22.4 defaults minus what cannot work in a namespace machine or a container: disks
// and partitions (growpart, resizefs, disk_setup, mounts), services without an init system
// (rsyslog, ntp, ssh host keys, keys-to-console, hotplug, power-state-change), hardware (keyboard,
// grub-dpkg, byobu, disable-ec2-metadata) and vendor agents (snap, lxd, fan, landscape, puppet,
// chef, mcollective, salt-minion, rmc, rightscale). With hostname, cloud-init also sets the host
// name and /etc/hosts (set_hostname, update_hostname, update_etc_hosts): the local provider's
// machines own theirs; a container's are the container runtime's.
func ModuleLists(hostname bool) string {
	init := []string{"migrator", "seed_random", "bootcmd", "write-files"}
	if hostname {
		init = append(init, "set_hostname", "update_hostname", "update_etc_hosts")
	}
	init = append(init, "ca-certs", "users-groups")
	var b strings.Builder
	for _, l := range []struct {
		key     string
		modules []string
	}{
		{"cloud_init_modules", init},
		{"cloud_config_modules", []string{"ssh-import-id", "locale", "set-passwords", "apt-pipelining", "apt-configure", "timezone", "runcmd"}},
		{"cloud_final_modules", []string{"package-update-upgrade-install", "write-files-deferred", "scripts-vendor",
			"scripts-per-once", "scripts-per-boot", "scripts-per-instance", "scripts-user", "phone-home", "final-message"}},
	} {
		if b.Len() > 0 {
			b.WriteString("\n")
		}
		b.WriteString(l.key + ":\n")
		for _, m := range l.modules {
			b.WriteString(" - " + m + "\n")
		}
	}
	return b.String()
}
