package docker

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/kloud-dev/kloud/userdata"
)

// ImageRepo is the repository of the machine images kloud imports; the tag names the root
// filesystem it was imported from.
const ImageRepo = "kloud/machine"

// BootPath is where the boot script is uploaded into every machine.
const BootPath = "/usr/local/sbin/kloud-boot"

// bootScript is a machine's entrypoint (PID 1): cloud-init's four stages on every start, in one
// Python process (userdata.CloudInitStages: cloud-init is imported once, not four times; the four
// `cloud-init` commands when the image's python3 cannot import it), as the local provider's init
// runs them (providers/local/sandbox/init.go), then wait. Per-boot modules bring the agent back
// on every start; the log goes to the container's output (docker logs) and cloud-init writes
// /var/log/cloud-init-output.log. SIGTERM (docker stop) ends every process and the container at
// once; bash reaps orphans while it waits.
const bootScript = `#!/bin/bash
# Written by kloud (providers/docker): the machine's PID 1.
trap 'echo "kloud-boot: stopping"; kill -TERM -1 2>/dev/null; exit 0' TERM INT
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 HOME=/root
echo "kloud-boot: machine $(hostname) up"
IFS= read -r -d '' stages <<'KLOUD_STAGES_PY' || true
` + userdata.CloudInitStages + `
KLOUD_STAGES_PY
rc=0
/usr/bin/python3 -c "$stages" kloud-boot </dev/null || rc=$?
if [ "$rc" -eq ` + stagesUnavailable + ` ]; then
	for stage in "init --local" "init" "modules --mode=config" "modules --mode=final"; do
		echo "kloud-boot: cloud-init $stage"
		/usr/bin/cloud-init $stage </dev/null
		echo "kloud-boot: cloud-init $stage: exit $?"
	done
fi
echo "kloud-boot: cloud-init finished"
while :; do
	sleep 3600 &
	wait $!
done
`

// stagesUnavailable is userdata.StagesUnavailable as the boot script compares it
// (TestBootScript checks that they agree).
const stagesUnavailable = "3"

// ImageRef is the reference of the image imported from root filesystem directory rootfs.
func ImageRef(rootfs string) string {
	tag := strings.TrimPrefix(filepath.Base(filepath.Clean(rootfs)), "rootfs-")
	tag = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-' {
			return r
		}
		return '-'
	}, tag)
	if tag == "" || tag[0] == '.' || tag[0] == '-' {
		tag = "x" + tag
	}
	if len(tag) > 128 {
		tag = tag[:128]
	}
	return ImageRepo + ":" + tag
}

// ImportImage imports root filesystem directory rootfs into the daemon as ImageRef(rootfs),
// unless an image of that reference is there already, and returns the reference. The tar stream
// comes from GNU tar (which keeps every file type, owner and mode of the tree).
func ImportImage(ctx context.Context, cli *client.Client, rootfs string) (string, error) {
	ref := ImageRef(rootfs)
	if _, err := cli.ImageInspect(ctx, ref); err == nil {
		return ref, nil
	} else if !cerrdefs.IsNotFound(err) {
		return "", fmt.Errorf("inspect image %s: %w", ref, err)
	}
	if st, err := os.Stat(filepath.Join(rootfs, "usr/bin/cloud-init")); err != nil || !st.Mode().IsRegular() {
		return "", fmt.Errorf("machine image: %s is not a root filesystem with cloud-init (run scripts/setup.sh as root to build it)", rootfs)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	tar := exec.CommandContext(ctx, "tar", "-C", rootfs, "--numeric-owner", "-c", ".")
	out, err := tar.StdoutPipe()
	if err != nil {
		return "", err
	}
	var stderr strings.Builder
	tar.Stderr = &stderr
	if err := tar.Start(); err != nil {
		return "", fmt.Errorf("machine image: tar: %w", err)
	}
	res, err := cli.ImageImport(ctx, client.ImageImportSource{Source: out, SourceName: "-"}, ref, client.ImageImportOptions{
		Message: "kloud machine image from " + rootfs,
		Changes: []string{`LABEL kloud_image="` + filepath.Base(rootfs) + `"`, `ENTRYPOINT ["` + BootPath + `"]`},
	})
	if err != nil {
		tar.Process.Kill()
		tar.Wait()
		return "", fmt.Errorf("machine image: import %s: %w", rootfs, err)
	}
	jerr := jsonStreamError(res)
	res.Close()
	if werr := tar.Wait(); werr != nil {
		return "", fmt.Errorf("machine image: tar %s: %w: %s", rootfs, werr, stderr.String())
	}
	if jerr != nil {
		return "", fmt.Errorf("machine image: import %s: %w", rootfs, jerr)
	}
	if _, err := cli.ImageInspect(ctx, ref); err != nil {
		return "", fmt.Errorf("machine image: imported %s but cannot inspect it: %w", ref, err)
	}
	return ref, nil
}

// jsonStreamError reads a daemon's JSON message stream and returns its first error.
func jsonStreamError(r io.Reader) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var m struct {
			Error       string `json:"error"`
			ErrorDetail struct {
				Message string `json:"message"`
			} `json:"errorDetail"`
		}
		if json.Unmarshal(sc.Bytes(), &m) == nil && (m.Error != "" || m.ErrorDetail.Message != "") {
			return errors.New(m.Error + m.ErrorDetail.Message)
		}
	}
	return sc.Err()
}

// EnsureImage imports the machine image into the daemon unless it is there (kloud serve calls
// it in the background at startup, so the first build does not wait for it) and returns its
// reference.
func (d *Docker) EnsureImage(ctx context.Context) (string, error) { return d.ensureImage(ctx) }

// ensureImage returns the machine image's reference, importing it on first use.
func (d *Docker) ensureImage(ctx context.Context) (string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.image != "" {
		return d.image, nil
	}
	if d.opts.Image != "" {
		d.image = d.opts.Image
		return d.image, nil
	}
	if d.opts.BaseImage == "" {
		return "", errors.New("docker provider: no machine image: set KLOUD_BASE_IMAGE (scripts/setup.sh as root builds it) or docker.Options.Image")
	}
	cli, err := d.Client()
	if err != nil {
		return "", err
	}
	ref, err := ImportImage(ctx, cli, d.opts.BaseImage)
	if err != nil {
		return "", err
	}
	d.image = ref
	return ref, nil
}
