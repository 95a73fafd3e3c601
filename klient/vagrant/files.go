package vagrant

import "github.com/kloud-dev/kloud/userdata"

// vagrantfileSrc is every machine's Vagrantfile. It holds no parameter: it reads kloud.json next
// to it, so a box name, an image or a hostname is only ever a Ruby string value, never source.
const vagrantfileSrc = `# Written by kloud (klient --vagrant). The machine's parameters are in kloud.json; this file
# is the same for every machine and holds none of them.
require "json"
kloud = JSON.parse(File.read(File.join(__dir__, "kloud.json")))

Vagrant.configure("2") do |config|
  config.vm.synced_folder ".", "/vagrant", disabled: true
  if kloud["image"]
    # A container booted like a machine: docker's init as PID 1, cloud-init's four stages on the
    # NoCloud seed (boot.sh), the host's network.
    config.vm.provider "docker" do |d|
      d.image = kloud["image"]
      d.has_ssh = false
      d.cmd = ["/bin/sh", "/etc/kloud-vagrant/boot.sh"]
      d.volumes = [
        File.join(__dir__, "boot.sh") + ":/etc/kloud-vagrant/boot.sh:ro",
        File.join(__dir__, "cloud.cfg") + ":/etc/cloud/cloud.cfg.d/95-kloud-vagrant.cfg:ro",
        File.join(__dir__, "seed") + ":/var/lib/cloud/seed/nocloud:ro",
      ]
      args = ["--network=host", "--init", "--tmpfs=/run", "--hostname=" + kloud["hostname"]]
      args << "--memory=" + Integer(kloud["memoryMB"]).to_s + "m" if kloud["memoryMB"]
      args << "--cpus=" + Integer(kloud["cpus"]).to_s if kloud["cpus"]
      d.create_args = args
    end
  else
    config.vm.box = kloud["box"]
    config.vm.hostname = kloud["hostname"]
    config.vm.cloud_init :user_data, content_type: "text/cloud-config", path: File.join(__dir__, "seed", "user-data")
    ["virtualbox", "libvirt"].each do |name|
      config.vm.provider name do |v|
        v.memory = Integer(kloud["memoryMB"]) if kloud["memoryMB"]
        v.cpus = Integer(kloud["cpus"]) if kloud["cpus"]
      end
    end
  end
end
`

// bootSh is the docker provider's container command: the machine's init.
const bootSh = `#!/bin/sh
# Written by kloud (klient --vagrant): the container's command. It runs cloud-init's four stages
# on the NoCloud seed, as a machine's init does at boot, then waits until the container stops.
trap 'exit 0' TERM INT
echo "kloud: boot"
for stage in "init --local" "init" "modules --mode=config" "modules --mode=final"; do
	/usr/bin/cloud-init $stage || echo "kloud: cloud-init $stage failed (exit $?)"
done
echo "kloud: cloud-init finished"
while :; do sleep 3600 & wait $!; done
`

// cloudCfg is /etc/cloud/cloud.cfg.d/95-kloud-vagrant.cfg in a docker machine: NoCloud only,
// no network configuration (the container has the host's network), and cloud-init's module lists
// for a machine that is not a VM (userdata.ModuleLists), without the host name's modules.
func cloudCfg() string {
	return `# Written by kloud (klient --vagrant): this root filesystem runs as a container.
datasource_list: [NoCloud, None]
network:
  config: disabled
locale: C.UTF-8
manage_etc_hosts: false

` + userdata.ModuleLists(false)
}
