package vagrant

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/kloud-dev/kloud/internal/layersnap"
	"github.com/kloud-dev/kloud/klient/klientapi"
)

// Snapshots of this host's machines (vagrant.snapshot.save/restore/delete), kept on this host.
//
// Docker machines (Vagrant's docker provider has no `vagrant snapshot`): the machine's disk is
// its container's writable layer, the overlay2 upper dir the daemon reports (docker inspect:
// GraphDriver.Data.UpperDir). Save archives it with package internal/layersnap into
// <home>/snapshots/<id>.tar.zst (and <id>.json: the machine, the container's image, sizes);
// Restore unpacks it beside the target container's upper dir and swaps the two atomically,
// keeping the target's identity (IdentityPaths), and empties the layer's work dir. That needs the
// daemon's overlay2 data root on this host, readable by klient (klient --vagrant as root, the
// daemon local: DOCKER_HOST unset or a unix socket); anything else is ErrUnsupported, saying
// why. A snapshot restores into any docker machine of this host made from the same image (an
// upper dir is only valid over its own lower layers; layersnap refuses another).
//
// Box machines (virtualbox, libvirt, ... : providers with `vagrant snapshot`): `vagrant snapshot
// save -f ID`, `vagrant snapshot restore --no-provision --no-start ID`, `vagrant snapshot delete
// ID` in the machine's directory; the hypervisor keeps the snapshot (size unknown: 0), and it
// restores only into its own machine. (Not testable here: no nested virtualisation.)
//
// Save and Restore need the machine halted (ErrRunning otherwise) and hold the machine's lock,
// so no vagrant up of it runs meanwhile; Restore also checks, right before the swap, that the
// container has not been started behind Vagrant's back.

// Errors of snapshots (klient maps them to kite codes).
var (
	ErrRunning          = errors.New("the vagrant machine is running: halt it first")
	ErrUnsupported      = errors.New("snapshots of this vagrant machine are not possible on this host")
	ErrSnapshotNotFound = errors.New("no such snapshot on this vagrant host")
)

// IdentityPaths are the files of a docker machine's writable layer that make it itself rather
// than its content; a restore keeps the target's (its seed and boot files are bind mounts from
// the machine's directory, never in the layer).
var IdentityPaths = []string{"etc/machine-id", "etc/kloud/kite.key"}

// snapMeta is <id>.json beside a snapshot.
type snapMeta struct {
	ID       string    `json:"id"`
	Machine  string    `json:"machine"`
	Format   string    `json:"format"`
	Image    string    `json:"image,omitempty"` // docker: the container's image id
	Size     int64     `json:"size"`
	DiskSize int64     `json:"diskSize,omitempty"`
	Files    int       `json:"files,omitempty"`
	Created  time.Time `json:"created"`
}

const metaImage = "image" // layersnap metadata: the image id the layer was made over

func (m *Manager) snapDir() string { return filepath.Join(m.o.Home, "snapshots") }

func (m *Manager) snapPath(id, ext string) string { return filepath.Join(m.snapDir(), id+ext) }

// container is what docker inspect says of a docker machine's container.
type container struct {
	ID    string `json:"Id"`
	Image string `json:"Image"`
	State struct {
		Running bool `json:"Running"`
	} `json:"State"`
	GraphDriver struct {
		Name string            `json:"Name"`
		Data map[string]string `json:"Data"`
	} `json:"GraphDriver"`
}

// inspect returns machine pp's container and its overlay2 upper and work dirs, checked to be
// usable from here.
func (m *Manager) inspect(ctx context.Context, pp params) (c container, upper, work string, err error) {
	vm := m.view(pp, klientapi.VagrantStopped)
	if vm.ID == "" {
		return c, "", "", fmt.Errorf("machine %s has no container yet (vagrant up never ran): %w", pp.Name, ErrUnsupported)
	}
	out, err := m.docker(ctx, "container", "inspect", vm.ID)
	if err != nil {
		return c, "", "", err
	}
	var cs []container
	if err := json.Unmarshal(out, &cs); err != nil || len(cs) != 1 {
		return c, "", "", fmt.Errorf("docker inspect %s: unexpected answer (%v)", vm.ID, err)
	}
	c = cs[0]
	if c.GraphDriver.Name != "overlay2" {
		return c, "", "", fmt.Errorf("the Docker daemon keeps containers with storage driver %q; snapshots of docker machines need overlay2: %w", c.GraphDriver.Name, ErrUnsupported)
	}
	upper, work = c.GraphDriver.Data["UpperDir"], c.GraphDriver.Data["WorkDir"]
	if !filepath.IsAbs(upper) || filepath.Clean(upper) != upper || filepath.Base(upper) != "diff" || !filepath.IsAbs(work) {
		return c, "", "", fmt.Errorf("the Docker daemon reports upper dir %q: not an overlay2 layer: %w", upper, ErrUnsupported)
	}
	if fi, err := os.Lstat(upper); err != nil || !fi.IsDir() {
		return c, "", "", fmt.Errorf("the container's layer %s is not reachable from this klient (%v): the Docker daemon must run on this host (DOCKER_HOST unset or a unix socket) and klient --vagrant as root: %w", upper, err, ErrUnsupported)
	}
	return c, upper, work, nil
}

// stillStopped checks that machine pp's container is still container id and not running (it was
// not started or replaced behind Vagrant's back while its layer was read or restored).
func (m *Manager) stillStopped(ctx context.Context, pp params, id string) error {
	c, _, _, err := m.inspect(ctx, pp)
	if err != nil {
		return err
	}
	if c.State.Running || c.ID != id {
		return fmt.Errorf("the container was started or replaced meanwhile: %w", ErrRunning)
	}
	return nil
}

// docker runs the docker CLI with the vagrant commands' environment (Options.Env's DOCKER_HOST).
func (m *Manager) docker(ctx context.Context, args ...string) ([]byte, error) {
	bin, err := exec.LookPath("docker")
	if err != nil {
		return nil, fmt.Errorf("the docker command is missing (%v): %w", err, ErrUnsupported)
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = m.env()
	var stderr limitedBuffer
	stderr.max = 4096
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("docker %s: %w: %s", args[0], err, bytes.TrimSpace(stderr.Bytes()))
	}
	return out, nil
}

// SnapshotSave saves halted machine name's disk as snapshot id (replacing one of that id).
func (m *Manager) SnapshotSave(ctx context.Context, name, id string) (klientapi.VagrantSnapshot, error) {
	if err := klientapi.ValidVagrantSnapshot(id); err != nil {
		return klientapi.VagrantSnapshot{}, err
	}
	defer m.lock(name)()
	pp, err := m.machine(name)
	if err != nil {
		return klientapi.VagrantSnapshot{}, err
	}
	if err := os.MkdirAll(m.snapDir(), 0o700); err != nil {
		return klientapi.VagrantSnapshot{}, err
	}
	meta := snapMeta{ID: id, Machine: name, Created: time.Now().UTC()}
	if pp.Provider != "docker" {
		if _, err := m.run(ctx, name, "snapshot", "save", "-f", id); err != nil {
			return klientapi.VagrantSnapshot{}, err
		}
		meta.Format = klientapi.VagrantSnapshotFormatVagrant
	} else {
		c, upper, _, err := m.inspect(ctx, pp)
		if err != nil {
			return klientapi.VagrantSnapshot{}, fmt.Errorf("snapshot of machine %s: %w", name, err)
		}
		if c.State.Running {
			return klientapi.VagrantSnapshot{}, fmt.Errorf("snapshot of machine %s: %w", name, ErrRunning)
		}
		info, err := layersnap.SaveFile(ctx, upper, m.snapPath(id, ".tar.zst"), layersnap.SaveOptions{
			Meta: map[string]string{metaImage: c.Image},
			// Started behind Vagrant's back meanwhile (docker start): the layer was live.
			BeforeCommit: func() error { return m.stillStopped(ctx, pp, c.ID) },
		})
		if err != nil {
			return klientapi.VagrantSnapshot{}, fmt.Errorf("snapshot of machine %s: %w", name, err)
		}
		meta.Format, meta.Image, meta.Size, meta.DiskSize, meta.Files = klientapi.VagrantSnapshotFormatLayer, c.Image, info.Size, info.DiskSize, info.Files
	}
	if err := writeJSON(m.snapPath(id, ".json"), meta); err != nil {
		layersnap.RemoveFile(m.snapPath(id, ".tar.zst"))
		return klientapi.VagrantSnapshot{}, err
	}
	m.log.Info("vagrant machine snapshot saved", "machine", name, "snapshot", id, "format", meta.Format, "size", meta.Size)
	return klientapi.VagrantSnapshot{ID: id, Machine: name, Size: meta.Size, DiskSize: meta.DiskSize, Format: meta.Format}, nil
}

// SnapshotRestore replaces halted machine name's disk by snapshot id's, keeping its identity.
// On error the disk is what it was.
func (m *Manager) SnapshotRestore(ctx context.Context, name, id string) error {
	if err := klientapi.ValidVagrantSnapshot(id); err != nil {
		return err
	}
	defer m.lock(name)()
	pp, err := m.machine(name)
	if err != nil {
		return err
	}
	meta, err := m.readSnapMeta(id)
	if err != nil {
		return err
	}
	if meta.Format == klientapi.VagrantSnapshotFormatVagrant {
		if meta.Machine != name {
			return fmt.Errorf("snapshot %s is machine %s's (a Vagrant snapshot restores only into its own machine): %w", id, meta.Machine, ErrUnsupported)
		}
		_, err := m.run(ctx, name, "snapshot", "restore", "--no-provision", "--no-start", id)
		return err
	}
	if pp.Provider != "docker" {
		return fmt.Errorf("snapshot %s is a docker machine's layer; machine %s runs with %q: %w", id, name, pp.Provider, ErrUnsupported)
	}
	c, upper, work, err := m.inspect(ctx, pp)
	if err != nil {
		return fmt.Errorf("restore machine %s: %w", name, err)
	}
	if c.State.Running {
		return fmt.Errorf("restore machine %s: %w", name, ErrRunning)
	}
	f, err := os.Open(m.snapPath(id, ".tar.zst"))
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("snapshot %s: %w", id, ErrSnapshotNotFound)
	}
	if err != nil {
		return err
	}
	defer f.Close()
	err = layersnap.Restore(ctx, f, upper, layersnap.RestoreOptions{
		Match: map[string]string{metaImage: c.Image}, KeepPaths: IdentityPaths, WorkDir: work,
		BeforeSwap: func() error { return m.stillStopped(ctx, pp, c.ID) },
	})
	if err != nil {
		return fmt.Errorf("restore machine %s from snapshot %s: %w", name, id, err)
	}
	m.log.Info("vagrant machine restored", "machine", name, "snapshot", id, "from", meta.Machine)
	return nil
}

// SnapshotDelete removes snapshot id (taken of machine name, which may be gone). A snapshot
// that does not exist is not an error.
func (m *Manager) SnapshotDelete(ctx context.Context, name, id string) error {
	if err := klientapi.ValidVagrantSnapshot(id); err != nil {
		return err
	}
	meta, err := m.readSnapMeta(id)
	if errors.Is(err, ErrSnapshotNotFound) {
		return layersnap.RemoveFile(m.snapPath(id, ".tar.zst")) // what a crash between the two writes left
	}
	if err != nil {
		return err
	}
	if meta.Format == klientapi.VagrantSnapshotFormatVagrant {
		defer m.lock(meta.Machine)()
		if _, err := m.machine(meta.Machine); err == nil {
			if _, err := m.run(ctx, meta.Machine, "snapshot", "delete", id); err != nil {
				return err
			}
		} // a destroyed machine's snapshots went with it
	}
	if err := layersnap.RemoveFile(m.snapPath(id, ".tar.zst")); err != nil {
		return err
	}
	if err := os.Remove(m.snapPath(id, ".json")); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	m.log.Info("vagrant machine snapshot deleted", "machine", meta.Machine, "snapshot", id)
	return nil
}

func (m *Manager) readSnapMeta(id string) (snapMeta, error) {
	var meta snapMeta
	b, err := os.ReadFile(m.snapPath(id, ".json"))
	if errors.Is(err, fs.ErrNotExist) {
		return meta, fmt.Errorf("snapshot %s: %w", id, ErrSnapshotNotFound)
	}
	if err != nil {
		return meta, err
	}
	if err := json.Unmarshal(b, &meta); err != nil {
		return meta, fmt.Errorf("snapshot %s: %w", id, err)
	}
	if meta.ID != id || klientapi.ValidVagrantName(meta.Machine) != nil {
		return meta, fmt.Errorf("snapshot %s: its record names %q of machine %q", id, meta.ID, meta.Machine)
	}
	return meta, nil
}

// writeJSON writes v to path atomically (a temporary file renamed).
func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
