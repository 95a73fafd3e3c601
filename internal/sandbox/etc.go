package sandbox

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// etcFromHost are the host's paths under /etc the sandbox sees, read-only, when the host has
// them: the CA certificates (Debian's /etc/ssl/certs with ca-certificates.crt, Red Hat's
// extracted bundles) so that TLS clients verify servers, the dynamic linker's cache so that
// libraries outside the default directories load, and the alternatives' symlinks that some of
// /usr/bin (awk, editor, ...) point through. Nothing with a secret: not shadow, not ssh's host
// keys, not /etc/ssl/private, not kloud's configuration, not machine-id.
var etcFromHost = []string{
	"/etc/ssl/certs",
	"/etc/pki/tls/certs",
	"/etc/pki/ca-trust/extracted",
	"/etc/ld.so.cache",
	"/etc/alternatives",
}

// etcHosts names only the loopback addresses; the sandbox has no hostname of its own to resolve.
const etcHosts = `127.0.0.1	localhost
::1	localhost ip6-localhost ip6-loopback
`

// etcNsswitch reads accounts and hosts from the files here (and hosts from DNS): no host daemon
// (systemd, sssd, nscd) is reachable from the sandbox.
const etcNsswitch = `passwd:	files
group:	files
shadow:	files
hosts:	files dns
networks:	files
`

// buildEtc writes the sandbox's own /etc under root: generated passwd, group, hosts and
// nsswitch.conf, a copy of the host's resolv.conf (the sandbox shares the host's network
// namespace, so it resolves names as the host does: a template's http data source, a provider
// that reaches its API), the host's localtime, and the read-only binds of etcFromHost.
func buildEtc(root string, cfg *Config) error {
	etc := filepath.Join(root, "etc")
	if err := os.Mkdir(etc, 0o755); err != nil {
		return err
	}
	files := map[string]string{
		"passwd":        etcPasswd(cfg.UID, cfg.GID),
		"group":         etcGroup(cfg.GID),
		"hosts":         etcHosts,
		"nsswitch.conf": etcNsswitch,
	}
	// A copy, not a bind: on a host with a local resolver the file is a symlink into /run.
	if b, err := os.ReadFile("/etc/resolv.conf"); err == nil {
		files["resolv.conf"] = string(b)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("read the host's resolv.conf: %w", err)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(etc, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	binds := etcFromHost
	if target, err := os.Readlink("/etc/localtime"); err == nil {
		// Into /usr/share/zoneinfo, which is bound with /usr.
		if err := os.Symlink(target, filepath.Join(etc, "localtime")); err != nil {
			return err
		}
	} else if _, err := os.Stat("/etc/localtime"); err == nil {
		binds = append(binds[:len(binds):len(binds)], "/etc/localtime")
	}
	for _, p := range binds {
		if _, err := os.Stat(p); err != nil {
			continue
		}
		resolved, err := mkTarget(root, p)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		if err := bind(resolved, root+resolved, true); err != nil {
			return err
		}
	}
	return nil
}

// etcPasswd has root, nobody and, if it is another uid, the sandbox's user (kloud-sandbox). The
// sandbox user's home is /tmp, as its HOME is.
func etcPasswd(uid, gid int) string {
	s := "root:x:0:0:root:/root:/usr/sbin/nologin\n"
	if uid == DefaultUID {
		return s + fmt.Sprintf("nobody:x:%d:%d:nobody:/tmp:/bin/sh\n", DefaultUID, gid)
	}
	return s + fmt.Sprintf("nobody:x:%d:%d:nobody:/nonexistent:/usr/sbin/nologin\n", DefaultUID, DefaultGID) +
		fmt.Sprintf("kloud-sandbox:x:%d:%d:kloud sandbox:/tmp:/bin/sh\n", uid, gid)
}

// etcGroup has root, nogroup and, if it is another gid, the sandbox's group (kloud-sandbox).
func etcGroup(gid int) string {
	s := "root:x:0:\n" + fmt.Sprintf("nogroup:x:%d:\n", DefaultGID)
	if gid != DefaultGID {
		s += fmt.Sprintf("kloud-sandbox:x:%d:\n", gid)
	}
	return s
}
