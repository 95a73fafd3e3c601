package vagrant

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/kloud-dev/kloud/klient/klientapi"
)

// Info reports what this host can give its machines: its CPUs (those this process may run
// on), its memory and its architecture. Machines of Vagrant's docker provider run on the
// daemon of Options.Env's DOCKER_HOST, which is this host when vagrant drives a local daemon
// (the only setup kloud supports for them: the Vagrantfile bind-mounts the machine's seed from
// this host).
func (m *Manager) Info() (klientapi.VagrantHostInfo, error) {
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return klientapi.VagrantHostInfo{}, fmt.Errorf("host memory: %w", err)
	}
	return klientapi.VagrantHostInfo{
		CPUs:     runtime.NumCPU(),
		MemoryMB: int64(uint64(si.Totalram) * uint64(si.Unit) >> 20),
		Arch:     runtime.GOARCH,
	}, nil
}
