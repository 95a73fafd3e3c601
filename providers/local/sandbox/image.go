package sandbox

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/kloud-dev/kloud/userdata"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// The base image: a Debian root filesystem made by mmdebstrap, shared read-only by every machine
// as the overlay's lower dir. It is cached under cacheDir by a hash of its recipe below; change
// anything in the recipe and a new image is built beside the old one (machines keep the image
// they were created on).

const (
	imageRecipeVersion = 1
	imageSuite         = "bookworm"
	imageVariant       = "minbase"
	imageMarker        = ".kloud-image"
)

// imagePackages are installed on top of minbase.
func imagePackages() []string {
	return []string{
		"cloud-init", "ca-certificates", "curl", "iproute2", "iputils-ping", "bash", "sudo", "procps",
		"less", "ncurses-base", "rsync", // rsync: rsync over SSH (klient serves SSH, issue 22)
		"git", // git over SSH (git-upload-pack, git-receive-pack on the machine) and git in the shell
	}
}

// imageDpkgOpts keep documentation out of the image (copyright files stay).
func imageDpkgOpts() []string {
	return []string{
		"path-exclude=/usr/share/man/*",
		"path-exclude=/usr/share/info/*",
		"path-exclude=/usr/share/doc/*",
		"path-include=/usr/share/doc/*/copyright",
		"path-exclude=/usr/share/locale/*",
	}
}

// kloudCloudCfg is /etc/cloud/cloud.cfg.d/99-kloud-local.cfg: NoCloud only, and cloud-init's
// module lists for a machine that is not a VM (userdata.ModuleLists), with the host name's modules.
func kloudCloudCfg() string {
	return `# Written by kloud (providers/local/sandbox): this root filesystem runs as a namespace machine.
datasource_list: [NoCloud, None]
network:
  config: disabled
locale: C.UTF-8
manage_etc_hosts: true

` + userdata.ModuleLists(true)
}

// imageFiles are written into the image after mmdebstrap (path → content). mmdebstrap leaves the
// build host's resolv.conf and hostname behind; machines reach no resolver.
func imageFiles() map[string]string {
	return map[string]string{
		"etc/cloud/cloud.cfg.d/99-kloud-local.cfg": kloudCloudCfg(),
		"etc/resolv.conf":                          "# kloud local machine: no DNS, only the bridge subnet is reachable\n",
		"etc/hostname":                             "localhost\n",
		"etc/hosts":                                "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n",
		"etc/machine-id":                           "",
		"etc/default/locale":                       "LANG=C.UTF-8\n",
	}
}

// imageHash identifies the recipe.
func imageHash() string {
	b, _ := json.Marshal(struct {
		Version  int
		Suite    string
		Variant  string
		Packages []string
		Dpkg     []string
		Files    map[string]string
	}{imageRecipeVersion, imageSuite, imageVariant, imagePackages(), imageDpkgOpts(), imageFiles()})
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])[:16]
}

// DefaultCacheDir is $KLOUD_CACHE, or /var/cache/kloud.
func DefaultCacheDir() string {
	if d := os.Getenv("KLOUD_CACHE"); d != "" {
		return d
	}
	return "/var/cache/kloud"
}

// CachedBaseImage returns where EnsureBaseImage keeps the base image under cacheDir ("" means
// DefaultCacheDir) and whether a complete one is there, without building anything.
func CachedBaseImage(cacheDir string) (string, bool) {
	if cacheDir == "" {
		cacheDir = DefaultCacheDir()
	}
	hash := imageHash()
	final := filepath.Join(cacheDir, "rootfs-"+imageSuite+"-"+hash)
	return final, imageReady(final, hash)
}

// EnsureBaseImage returns the path of the base root filesystem under cacheDir ("" means
// DefaultCacheDir), building it with mmdebstrap (about a minute, network to the Debian mirror
// configured in /etc/apt/sources.list.d) if it is not cached yet. A cached image is found without
// running anything. Concurrent callers (other processes too) wait for one build; the image appears
// atomically (built in a temporary dir, then renamed). logger may be nil.
func EnsureBaseImage(ctx context.Context, cacheDir string, logger *slog.Logger) (string, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if cacheDir == "" {
		cacheDir = DefaultCacheDir()
	}
	hash := imageHash()
	final := filepath.Join(cacheDir, "rootfs-"+imageSuite+"-"+hash)
	if imageReady(final, hash) {
		return final, nil
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", fmt.Errorf("base image: %w", err)
	}
	lock, err := lockPath(ctx, filepath.Join(cacheDir, ".rootfs-"+hash+".lock"))
	if err != nil {
		return "", fmt.Errorf("base image: %w", err)
	}
	defer lock.unlock()
	if imageReady(final, hash) { // built by someone else while we waited
		return final, nil
	}
	mmdebstrap, err := exec.LookPath("mmdebstrap")
	if err != nil {
		return "", errors.New("base image: mmdebstrap is not installed (apt-get install mmdebstrap)")
	}
	mirror, err := debianMirror()
	if err != nil {
		return "", fmt.Errorf("base image: %w", err)
	}
	// Leftovers of an interrupted build.
	old, _ := filepath.Glob(filepath.Join(cacheDir, ".tmp-rootfs-"+hash+"-*"))
	for _, o := range old {
		os.RemoveAll(o)
	}
	os.RemoveAll(final) // a directory without a valid marker is not an image
	tmpParent, err := os.MkdirTemp(cacheDir, ".tmp-rootfs-"+hash+"-")
	if err != nil {
		return "", fmt.Errorf("base image: %w", err)
	}
	defer os.RemoveAll(tmpParent)
	tmp := filepath.Join(tmpParent, "rootfs") // mmdebstrap wants a missing or empty target
	logPath := filepath.Join(cacheDir, "rootfs-"+hash+".build.log")

	args := []string{"--variant=" + imageVariant, "--include=" + strings.Join(imagePackages(), ",")}
	for _, o := range imageDpkgOpts() {
		args = append(args, "--dpkgopt="+o)
	}
	args = append(args, imageSuite, tmp, "deb "+mirror+" "+imageSuite+" main")
	logger.Info("building base image", "path", final, "suite", imageSuite, "log", logPath)
	t0 := time.Now()
	logf, err := os.Create(logPath)
	if err != nil {
		return "", fmt.Errorf("base image: %w", err)
	}
	cmd := exec.CommandContext(ctx, mmdebstrap, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	runErr := cmd.Run()
	logf.Close()
	if runErr != nil {
		return "", fmt.Errorf("base image: mmdebstrap (log %s): %s: %w", logPath, tailFile(logPath, 15), runErr)
	}
	for p, content := range imageFiles() {
		dst := filepath.Join(tmp, p)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return "", fmt.Errorf("base image: %w", err)
		}
		os.Remove(dst) // may be a symlink
		if err := os.WriteFile(dst, []byte(content), 0o644); err != nil {
			return "", fmt.Errorf("base image: %w", err)
		}
	}
	if err := os.WriteFile(filepath.Join(tmp, imageMarker), []byte(hash+"\n"), 0o644); err != nil {
		return "", fmt.Errorf("base image: %w", err)
	}
	if err := os.Rename(tmp, final); err != nil {
		return "", fmt.Errorf("base image: %w", err)
	}
	logger.Info("built base image", "path", final, "took", time.Since(t0).Round(time.Second))
	return final, nil
}

func imageReady(dir, hash string) bool {
	b, err := os.ReadFile(filepath.Join(dir, imageMarker))
	return err == nil && strings.TrimSpace(string(b)) == hash
}

// tailFile returns the last n lines of a file, joined with " | ".
func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// debianMirror reads the Debian archive URI from apt's configuration on this host
// (/etc/apt/sources.list.d/*.sources and *.list, then /etc/apt/sources.list): the first enabled
// "deb" entry with a plain release suite (not -security/-updates/-backports) and the main
// component.
func debianMirror() (string, error) {
	var files []string
	for _, pat := range []string{"/etc/apt/sources.list.d/*.sources", "/etc/apt/sources.list.d/*.list"} {
		m, _ := filepath.Glob(pat)
		files = append(files, m...)
	}
	files = append(files, "/etc/apt/sources.list")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var entries []aptEntry
		if strings.HasSuffix(f, ".sources") {
			entries = parseDeb822(b)
		} else {
			entries = parseOneLine(b)
		}
		for _, e := range entries {
			if e.enabled && slices.Contains(e.types, "deb") && slices.Contains(e.components, "main") &&
				slices.ContainsFunc(e.suites, func(s string) bool { return !strings.Contains(s, "-") && !strings.Contains(s, "/") }) &&
				len(e.uris) > 0 {
				return strings.TrimRight(e.uris[0], "/"), nil
			}
		}
	}
	return "", errors.New("no Debian mirror found in /etc/apt/sources.list.d or /etc/apt/sources.list")
}

type aptEntry struct {
	enabled                         bool
	types, uris, suites, components []string
}

func parseDeb822(b []byte) []aptEntry {
	var out []aptEntry
	for _, stanza := range strings.Split(strings.ReplaceAll(string(b), "\r\n", "\n"), "\n\n") {
		e := aptEntry{enabled: true}
		sc := bufio.NewScanner(strings.NewReader(stanza))
		for sc.Scan() {
			line := sc.Text()
			if strings.HasPrefix(line, "#") || strings.HasPrefix(line, " ") || strings.HasPrefix(line, "\t") {
				continue
			}
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			f := strings.Fields(v)
			switch strings.ToLower(strings.TrimSpace(k)) {
			case "types":
				e.types = f
			case "uris":
				e.uris = f
			case "suites":
				e.suites = f
			case "components":
				e.components = f
			case "enabled":
				e.enabled = strings.TrimSpace(v) != "no"
			}
		}
		if len(e.types) > 0 {
			out = append(out, e)
		}
	}
	return out
}

func parseOneLine(b []byte) []aptEntry {
	var out []aptEntry
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) > 1 && strings.HasPrefix(f[1], "[") { // options
			i := slices.IndexFunc(f[1:], func(s string) bool { return strings.HasSuffix(s, "]") })
			if i < 0 {
				continue
			}
			f = append(f[:1], f[i+2:]...)
		}
		if len(f) < 4 {
			continue
		}
		out = append(out, aptEntry{enabled: true, types: f[:1], uris: f[1:2], suites: f[2:3], components: f[3:]})
	}
	return out
}
