package docker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/moby/moby/client"

	"github.com/kloud-dev/kloud/internal/layersnap"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/provider"
)

// Snapshots (provider.Snapshotter): a docker machine's disk is its container's writable layer,
// the overlay2 upper dir the daemon reports (ContainerInspect: GraphDriver.Data["UpperDir"],
// <data root>/overlay2/<layer>/diff). While the container is stopped the daemon has it unmounted
// and does not touch it, so kloud saves it with internal/layersnap as a tar+zstd file in the
// provider's state dir (StateDir/snapshots/<id>.tar.zst) and restores one by unpacking it beside
// the diff dir and swapping the two atomically (renameat2 RENAME_EXCHANGE), exactly as the local
// provider does with its machines' upper dirs. The daemon never sees a half-written layer: both
// refuse a running (or paused) container (provider.ErrRunning), and both check that the container
// was not started meanwhile (its StartedAt), a restore right before the swap. A snapshot may be
// restored into any docker machine of this kloud made from the same image (the layer is only
// valid over its own lower layers); the target keeps its identity: its NoCloud seed (instance-id,
// user data), its kite key, its machine-id and kloud's boot script (IdentityFiles).
//
// This needs the daemon's storage on this host: the daemon is reached through a unix socket, its
// storage driver is overlay2 and its data root (DockerRootDir) is readable here. The provider
// asks (layers: the daemon's Info, layersSupport) when it is asked what it can do (Caps, through
// Provider.MoreCaps: provider.describe, kloud's checks before a snapshot call) and before each
// operation, and keeps the answer a short time (layersTTL, layersTTLFailed): it advertises
// provider.CapSnapshot only while the answer is yes, so a daemon that was down when kloud started
// gives snapshots as soon as it answers. Each operation also checks that the container's own
// directory (<data root>/containers/<id>/config.v2.json) is here and is that container's, so a
// socket forwarded from another host with the same paths is refused too.

// IdentityFiles are the files of a docker machine's writable layer (relative paths) that make it
// itself rather than its content; Restore keeps the target's.
var IdentityFiles = []string{
	"etc/machine-id",
	"etc/kloud/kite.key",
	"var/lib/cloud/seed/nocloud/meta-data",
	"var/lib/cloud/seed/nocloud/user-data",
	strings.TrimPrefix(BootPath, "/"),
}

// SnapshotFormat is what SnapshotInfo.Format says of docker snapshots.
const SnapshotFormat = "tar+zstd"

// Snapshot metadata keys (layersnap.SaveOptions.Meta).
const (
	metaImage     = "image"
	metaMachine   = "machine"
	metaContainer = "container"
)

// errLayersNotHere wraps why snapshots are not offered.
var errLayersNotHere = errors.New("the Docker daemon's container layers are not reachable from kloud")

// layersSupport reports whether kloud can read and write the daemon's container layers (nil)
// and returns the daemon's data root; else why not.
func (d *Docker) layersSupport(ctx context.Context) (string, error) {
	if err := onThisHost(d.host); err != nil {
		return "", fmt.Errorf("%w: %w", errLayersNotHere, err)
	}
	cli, err := d.Client()
	if err != nil {
		return "", fmt.Errorf("%w: %w", errLayersNotHere, err)
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	info, err := cli.Info(ctx, client.InfoOptions{})
	if err != nil {
		return "", fmt.Errorf("%w: %w", errLayersNotHere, err)
	}
	return info.Info.DockerRootDir, checkLayers(info.Info.Driver, info.Info.DockerRootDir)
}

// checkLayers checks what the daemon's Info says against this host.
func checkLayers(driver, root string) error {
	if driver != "overlay2" {
		return fmt.Errorf("%w: the daemon's storage driver is %q, snapshots need overlay2", errLayersNotHere, driver)
	}
	if !filepath.IsAbs(root) {
		return fmt.Errorf("%w: the daemon's data root %q is not an absolute path", errLayersNotHere, root)
	}
	for _, sub := range []string{"overlay2", "containers"} {
		p := filepath.Join(root, sub)
		fi, err := os.Lstat(p)
		if err != nil {
			return fmt.Errorf("%w: %w", errLayersNotHere, err)
		}
		if !fi.IsDir() {
			return fmt.Errorf("%w: %s is not a directory", errLayersNotHere, p)
		}
		f, err := os.Open(p)
		if err != nil {
			return fmt.Errorf("%w: %w", errLayersNotHere, err)
		}
		f.Close()
	}
	return nil
}

// How long an answer of layersSupport is kept: a yes for a minute (the daemon's data root does
// not move while it runs), a no for a moment (the daemon may be starting).
const (
	layersTTL       = time.Minute
	layersTTLFailed = 2 * time.Second
)

// layers returns the daemon's data root if kloud can read and write its container layers, else
// why not: layersSupport's answer, kept for layersTTL (layersTTLFailed for a no). A stale answer
// is asked again; with wait, the caller waits for the new answer (callers at the same time wait
// for one), else it gets the stale one at once while the new one is asked in the background (only
// the very first answer is waited for): Caps must not wait on a daemon that hangs.
func (d *Docker) layers(ctx context.Context, wait bool) (string, error) {
	d.layersMu.Lock()
	ttl := layersTTL
	if d.layersErr != nil {
		ttl = layersTTLFailed
	}
	asked := !d.layersAt.IsZero()
	fresh := asked && time.Since(d.layersAt) < ttl
	if fresh || (asked && !wait) {
		if !fresh && d.layersAsking == nil {
			d.askLayers()
		}
		defer d.layersMu.Unlock()
		return d.layersRoot, d.layersErr
	}
	ch := d.layersAsking
	if ch == nil {
		ch = d.askLayers()
	}
	d.layersMu.Unlock()
	select {
	case <-ch:
	case <-ctx.Done():
		return "", fmt.Errorf("%w: %w", errLayersNotHere, ctx.Err())
	}
	d.layersMu.Lock()
	defer d.layersMu.Unlock()
	return d.layersRoot, d.layersErr
}

// askLayers asks layersSupport in the background and returns a channel closed when the answer is
// kept. d.layersMu is held.
func (d *Docker) askLayers() chan struct{} {
	ch := make(chan struct{})
	d.layersAsking = ch
	go func() {
		defer close(ch)
		root, err := d.layersSupport(context.Background())
		d.layersMu.Lock()
		defer d.layersMu.Unlock()
		switch first := d.layersAt.IsZero(); {
		case err != nil && (first || d.layersErr == nil):
			d.log.Info("docker provider: no snapshots", "why", err)
		case err == nil && !first && d.layersErr != nil:
			d.log.Info("docker provider: snapshots offered: the daemon's layers are reachable now")
		}
		d.layersRoot, d.layersErr, d.layersAt, d.layersAsking = root, err, time.Now(), nil
	}()
	return ch
}

// SnapshotsWhyNot is nil when the provider offers snapshots now (asked again if the last answer
// is stale), else why not.
func (d *Docker) SnapshotsWhyNot() error {
	_, err := d.layers(context.Background(), true)
	return err
}

// snapshotCaps is the provider's Provider.MoreCaps: snapshot while the daemon's layers are here.
func (d *Docker) snapshotCaps() []provider.Capability {
	if _, err := d.layers(context.Background(), false); err != nil {
		return nil
	}
	return []provider.Capability{provider.CapSnapshot}
}

// SnapshotPath is where snapshot snapID is kept.
func (d *Docker) SnapshotPath(snapID string) string {
	return filepath.Join(d.opts.StateDir, "snapshots", snapID+".tar.zst")
}

// stoppedLayer is a stopped container's writable layer.
type stoppedLayer struct {
	upper, work string
	image       string
	startedAt   string // State.StartedAt when it was found stopped
}

// layer returns the stopped container's writable layer, checked to be the daemon's on this host.
func (m *machine) layer(ctx context.Context) (stoppedLayer, error) {
	var l stoppedLayer
	root, err := m.d.layers(ctx, true)
	if err != nil {
		return l, fmt.Errorf("%w: %w", err, provider.ErrUnsupported)
	}
	res, err := m.inspect(ctx)
	if err != nil {
		return l, err
	}
	c := res.Container
	switch st := c.State; {
	case st == nil:
		return l, errors.New("the daemon reports no state")
	case st.Running || st.Paused || st.Restarting:
		return l, provider.ErrRunning
	case st.Dead || st.Status == "removing":
		return l, fmt.Errorf("the container is being removed: %w", kite.ErrState)
	default:
		l.startedAt = st.StartedAt
	}
	if c.GraphDriver == nil || c.GraphDriver.Name != "overlay2" {
		return l, fmt.Errorf("%w: the container's storage is not overlay2: %w", errLayersNotHere, provider.ErrUnsupported)
	}
	l.upper, l.work, l.image = c.GraphDriver.Data["UpperDir"], c.GraphDriver.Data["WorkDir"], c.Image
	layerDir := filepath.Dir(l.upper)
	if l.upper != filepath.Clean(l.upper) || filepath.Base(l.upper) != "diff" || filepath.Dir(layerDir) != filepath.Join(root, "overlay2") ||
		l.work != filepath.Join(layerDir, "work") || l.image == "" {
		return l, fmt.Errorf("%w: unexpected layer paths %q, %q (data root %s): %w", errLayersNotHere, l.upper, l.work, root, provider.ErrUnsupported)
	}
	// The container's own directory proves the daemon's storage is this host's.
	b, err := os.ReadFile(filepath.Join(root, "containers", c.ID, "config.v2.json"))
	var cfg struct{ ID string }
	if err == nil {
		err = json.Unmarshal(b, &cfg)
	}
	if err != nil || cfg.ID != c.ID {
		return l, fmt.Errorf("%w: container %.12s's directory is not under %s on this host (%v): %w", errLayersNotHere, c.ID, root, err, provider.ErrUnsupported)
	}
	if fi, err := os.Lstat(l.upper); err != nil || !fi.IsDir() {
		return l, fmt.Errorf("%w: the container's layer %s: %v: %w", errLayersNotHere, l.upper, err, provider.ErrUnsupported)
	}
	return l, nil
}

// stillStopped checks that the container was not started since l was found.
func (m *machine) stillStopped(ctx context.Context, l stoppedLayer) error {
	res, err := m.inspect(ctx)
	if err != nil {
		return err
	}
	if st := res.Container.State; st == nil || st.Running || st.Paused || st.Restarting || st.StartedAt != l.startedAt {
		return fmt.Errorf("the container was started meanwhile: %w", provider.ErrRunning)
	}
	return nil
}

func (m *machine) snapshotErr(op string, err error) error {
	if errors.Is(err, provider.ErrUnsupported) || errors.Is(err, provider.ErrRunning) {
		return fmt.Errorf("%s docker machine %s (%.12s): %w", op, m.b.Label, m.id, err)
	}
	return m.wrap(op, err)
}

// Snapshot saves the stopped container's writable layer as snapID.
func (m *machine) Snapshot(ctx context.Context, snapID string) (provider.SnapshotInfo, error) {
	if err := provider.SnapshotIDOK(snapID); err != nil {
		return provider.SnapshotInfo{}, fmt.Errorf("%w: %w", err, kite.ErrInvalidParams)
	}
	l, err := m.layer(ctx)
	if err != nil {
		return provider.SnapshotInfo{}, m.snapshotErr("snapshot", err)
	}
	info, err := layersnap.SaveFile(ctx, l.upper, m.d.SnapshotPath(snapID), layersnap.SaveOptions{
		Meta:         map[string]string{metaImage: l.image, metaMachine: m.b.ID, metaContainer: m.id},
		BeforeCommit: func() error { return m.stillStopped(ctx, l) },
	})
	if err != nil {
		return provider.SnapshotInfo{}, m.snapshotErr("snapshot", err)
	}
	m.d.log.Info("docker machine disk saved", "machine", m.b.Label, "container", m.id, "snapshot", snapID, "size", info.Size, "disk", info.DiskSize, "files", info.Files)
	return provider.SnapshotInfo{Size: info.Size, DiskSize: info.DiskSize, Format: SnapshotFormat}, nil
}

// Restore replaces the stopped container's writable layer by snapshot snapID's, keeping the
// machine's IdentityFiles.
func (m *machine) Restore(ctx context.Context, snapID string) error {
	if err := provider.SnapshotIDOK(snapID); err != nil {
		return fmt.Errorf("%w: %w", err, kite.ErrInvalidParams)
	}
	l, err := m.layer(ctx)
	if err != nil {
		return m.snapshotErr("restore", err)
	}
	f, err := os.Open(m.d.SnapshotPath(snapID))
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("restore docker machine %s (%.12s): snapshot %q: %w", m.b.Label, m.id, snapID, kite.ErrNotFound)
	}
	if err != nil {
		return m.snapshotErr("restore", err)
	}
	defer f.Close()
	err = layersnap.Restore(ctx, f, l.upper, layersnap.RestoreOptions{
		Match:      map[string]string{metaImage: l.image},
		KeepPaths:  IdentityFiles,
		WorkDir:    l.work,
		BeforeSwap: func() error { return m.stillStopped(ctx, l) },
	})
	if me := (*layersnap.MismatchError)(nil); errors.As(err, &me) && me.Key == metaImage {
		return fmt.Errorf("restore docker machine %s (%.12s): the snapshot's disk was made over image %s, this machine runs %s: restore it into a machine of the same image: %w",
			m.b.Label, m.id, me.Have, me.Want, kite.ErrInvalidParams)
	}
	if err != nil {
		return m.snapshotErr("restore", err)
	}
	m.d.log.Info("docker machine disk restored", "machine", m.b.Label, "container", m.id, "snapshot", snapID)
	return nil
}

// DeleteSnapshot removes snapshot snapID (whichever docker machine it was taken of) and what an
// interrupted Snapshot of it left.
func (m *machine) DeleteSnapshot(ctx context.Context, snapID string) error {
	return m.d.DeleteSnapshot(snapID)
}

// DeleteSnapshot removes snapshot snapID's file (a missing one is not an error).
func (d *Docker) DeleteSnapshot(snapID string) error {
	if err := provider.SnapshotIDOK(snapID); err != nil {
		return fmt.Errorf("%w: %w", err, kite.ErrInvalidParams)
	}
	if err := layersnap.RemoveFile(d.SnapshotPath(snapID)); err != nil {
		return fmt.Errorf("delete docker snapshot %q: %w", snapID, err)
	}
	return nil
}

var _ provider.Snapshotter = (*machine)(nil)
