package klientapi

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/kloud-dev/kloud/kontrol/kontrolapi"
)

// A klient started with --vagrant on a host that has Vagrant is its owner's vagrant host: it
// registers under the kite name VagrantHostName (with the owner's kite key, never a machine's
// agent key: kontrol refuses an agent key that claims the name) and serves the vagrant.* methods
// below, which kloud's vagrant provider calls with a token of the owner for this kite. Every
// machine is a directory under the klient's vagrant home holding a Vagrantfile (a fixed file that
// reads the machine's parameters from kloud.json next to it, so no value is ever Ruby source),
// the NoCloud seed (user-data, meta-data) and, for the docker provider, the boot script that runs
// cloud-init in the container.
const (
	// VagrantHostName is the kite name of a host klient (klient --vagrant).
	VagrantHostName = kontrolapi.VagrantHostName

	MethodVagrantCreate  = "vagrant.create"
	MethodVagrantUp      = "vagrant.up"
	MethodVagrantHalt    = "vagrant.halt"
	MethodVagrantDestroy = "vagrant.destroy"
	MethodVagrantStatus  = "vagrant.status"
	MethodVagrantList    = "vagrant.list"
	// MethodVagrantInfo reports what the host can give its machines (VagrantHostInfo): kloud's
	// vagrant provider checks a machine's cpus and memory against it at plan time.
	MethodVagrantInfo = "vagrant.info"
	// Snapshots of a machine's disk, kept on the host (vagrant_snapshot.go).
	MethodVagrantSnapshotSave    = "vagrant.snapshot.save"
	MethodVagrantSnapshotRestore = "vagrant.snapshot.restore"
	MethodVagrantSnapshotDelete  = "vagrant.snapshot.delete"
)

// Vagrant machine states (VagrantMachine.State), from `vagrant status`.
const (
	VagrantRunning    = "running"
	VagrantStopped    = "stopped" // poweroff, saved, stopped, aborted, paused
	VagrantNotCreated = "notCreated"
	VagrantAbsent     = "absent" // no such machine directory
	VagrantUnknown    = "unknown"
)

// Limits of vagrant.create's params.
const (
	VagrantMaxUserData = 1 << 20
	VagrantMinMemoryMB = 64
	VagrantMaxMemoryMB = 1 << 20
	VagrantMaxCPUs     = 256
)

var (
	vagrantNameRE     = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)
	vagrantBoxRE      = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}(/[A-Za-z0-9][A-Za-z0-9._-]{0,63})?$`)
	vagrantImageRE    = regexp.MustCompile(`^[a-z0-9][a-z0-9._/-]{0,199}(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[a-f0-9]{64})?$`)
	vagrantProviderRE = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,31}$`)
	vagrantHostnameRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$`)
	vagrantTokenRE    = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)
)

// VagrantCreateParams are the params of vagrant.create: write the machine's directory (its
// Vagrantfile, parameters and NoCloud seed). It does not boot it (vagrant.up does). Creating a
// machine that exists with the same parameters changes nothing (a retry); with others it is a
// conflict (-32004): destroy it first.
type VagrantCreateParams struct {
	Token string `json:"token"`
	// Name is the machine's directory and Vagrant machine (1-63 of [a-z0-9-]); kloud uses the
	// machine's id.
	Name string `json:"name"`
	// Provider is the Vagrant provider (default "docker" when Image is set, else Vagrant's own
	// default, e.g. "virtualbox").
	Provider string `json:"provider,omitempty"`
	// Box (a Vagrant box, e.g. "debian/bookworm64") or Image (a Docker image, docker provider):
	// exactly one.
	Box   string `json:"box,omitempty"`
	Image string `json:"image,omitempty"`
	// Hostname inside the machine (cloud-init's local-hostname; default Name).
	Hostname string `json:"hostname,omitempty"`
	// MemoryMB and CPUs limit the machine (0: the provider's default).
	MemoryMB int `json:"memoryMB,omitempty"`
	CPUs     int `json:"cpus,omitempty"`
	// UserData is cloud-init's user data, delivered as a NoCloud seed.
	UserData string `json:"userData,omitempty"`
}

// Validate implements kite.Validator.
func (p *VagrantCreateParams) Validate() error {
	if err := validToken(p.Token); err != nil {
		return err
	}
	return p.ValidateMachine()
}

// ValidateMachine checks everything but the token (what the host klient writes).
func (p *VagrantCreateParams) ValidateMachine() error {
	if err := ValidVagrantName(p.Name); err != nil {
		return err
	}
	switch {
	case (p.Box == "") == (p.Image == ""):
		return errors.New("give exactly one of box (a Vagrant box) and image (a Docker image)")
	case p.Box != "" && (!vagrantBoxRE.MatchString(p.Box) || strings.Contains(p.Box, "..")):
		return fmt.Errorf("box %q: want NAME or ORG/NAME of [A-Za-z0-9._-]", p.Box)
	case p.Image != "" && (!vagrantImageRE.MatchString(p.Image) || strings.Contains(p.Image, "..")):
		return fmt.Errorf("image %q: want a Docker image reference (lower-case repository, optional :tag and @sha256:digest)", p.Image)
	case p.Provider != "" && !vagrantProviderRE.MatchString(p.Provider):
		return fmt.Errorf("provider %q: want a Vagrant provider name ([a-z][a-z0-9_-]*)", p.Provider)
	case p.Image != "" && p.Provider != "" && p.Provider != "docker":
		return fmt.Errorf("image %q needs the docker provider, not %q (use box for other providers)", p.Image, p.Provider)
	case p.Box != "" && p.Provider == "docker":
		return errors.New("the docker provider runs an image, not a box: set image")
	case p.Hostname != "" && !vagrantHostnameRE.MatchString(p.Hostname):
		return fmt.Errorf("hostname %q: one label of letters, digits and '-', at most 63 characters", p.Hostname)
	case p.MemoryMB != 0 && (p.MemoryMB < VagrantMinMemoryMB || p.MemoryMB > VagrantMaxMemoryMB):
		return fmt.Errorf("memoryMB %d: between %d and %d, or 0 for the provider's default", p.MemoryMB, VagrantMinMemoryMB, VagrantMaxMemoryMB)
	case p.CPUs < 0 || p.CPUs > VagrantMaxCPUs:
		return fmt.Errorf("cpus %d: between 1 and %d, or 0 for the provider's default", p.CPUs, VagrantMaxCPUs)
	case len(p.UserData) > VagrantMaxUserData:
		return fmt.Errorf("userData: %d bytes, at most %d", len(p.UserData), VagrantMaxUserData)
	}
	return nil
}

// VagrantNameParams are the params of vagrant.up, vagrant.halt, vagrant.destroy and
// vagrant.status.
type VagrantNameParams struct {
	Token string `json:"token"`
	Name  string `json:"name"`
}

// Validate implements kite.Validator.
func (p *VagrantNameParams) Validate() error {
	if err := validToken(p.Token); err != nil {
		return err
	}
	return ValidVagrantName(p.Name)
}

// VagrantListParams are the params of vagrant.list.
type VagrantListParams struct {
	Token string `json:"token"`
}

// Validate implements kite.Validator.
func (p *VagrantListParams) Validate() error { return validToken(p.Token) }

// VagrantInfoParams are the params of vagrant.info.
type VagrantInfoParams = VagrantListParams

// VagrantHostInfo is the result of vagrant.info: what the host has for its machines. Machines
// with Vagrant's docker provider share the host's kernel, CPUs and memory; a box provider's
// virtual machines get at most the host's too.
type VagrantHostInfo struct {
	// CPUs is the number of CPUs the host klient may use.
	CPUs int `json:"cpus"`
	// MemoryMB is the host's memory in MiB (MemTotal).
	MemoryMB int64 `json:"memoryMB"`
	// Arch is the host's CPU architecture as Go names it (amd64, arm64, ...).
	Arch string `json:"arch"`
}

// VagrantMachine is a machine as vagrant.* methods report it.
type VagrantMachine struct {
	Name     string `json:"name"`
	State    string `json:"state"`              // Vagrant* states above
	Provider string `json:"provider,omitempty"` // the Vagrant provider
	Box      string `json:"box,omitempty"`
	Image    string `json:"image,omitempty"`
	Hostname string `json:"hostname,omitempty"`
	MemoryMB int    `json:"memoryMB,omitempty"`
	CPUs     int    `json:"cpus,omitempty"`
	// Dir is the machine's directory on the host (its Vagrantfile).
	Dir string `json:"dir,omitempty"`
	// ID is the Vagrant provider's id of the machine once created (the docker provider: the
	// container id).
	ID string `json:"id,omitempty"`
}

// VagrantListResult is the result of vagrant.list.
type VagrantListResult struct {
	Machines []VagrantMachine `json:"machines"`
}

// ValidVagrantName checks a machine name: 1-63 of [a-z0-9-], starting with a letter or digit
// (so it is a safe directory name and a Docker container name).
func ValidVagrantName(name string) error {
	if !vagrantNameRE.MatchString(name) {
		return fmt.Errorf("name %q: want 1-63 of [a-z0-9-], starting with a letter or digit", name)
	}
	return nil
}

func validToken(t string) error {
	if t == "" {
		return errors.New("token is required (a kite token of the host's owner for this klient, minted by kloud)")
	}
	if len(t) > 8192 || !vagrantTokenRE.MatchString(t) {
		return errors.New("token is not a JWT")
	}
	return nil
}
