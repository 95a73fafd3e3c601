package sandbox

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// Available reports whether machines can run on this host: nil if so, else an error that says in
// plain words what is missing (for kloud to show as is).
func Available() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("local machines need root (this process runs as uid %d)", os.Geteuid())
	}
	for _, bin := range []string{"ip", "nsenter"} {
		if _, err := exec.LookPath(bin); err != nil {
			return fmt.Errorf("local machines need the %q program (apt-get install iproute2 util-linux)", bin)
		}
	}
	for _, ns := range []string{"pid", "mnt", "net", "uts", "ipc"} {
		if _, err := os.Stat("/proc/self/ns/" + ns); err != nil {
			return fmt.Errorf("local machines need %s namespaces, which this kernel does not offer", ns)
		}
	}
	fss, err := os.ReadFile("/proc/filesystems")
	if err != nil {
		return fmt.Errorf("cannot read /proc/filesystems: %w", err)
	}
	if !strings.Contains(string(fss), "\toverlay\n") {
		return errors.New("local machines need the overlay filesystem (modprobe overlay)")
	}
	return nil
}
