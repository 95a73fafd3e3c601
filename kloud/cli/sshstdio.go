package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/coder/websocket"
	"github.com/spf13/cobra"

	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
)

// OpenSSH through kloud (docs/user-guide.md "SSH, scp, rsync and IDEs"): `kloud ssh --stdio
// HOST` is the ProxyCommand that carries one SSH connection over stdin/stdout to the machine's
// klient, through kloud's GET /api/machines/{id}/ssh; `kloud config-ssh` writes the Host entries
// that use it in ~/.ssh/config, between markers, with the machines' host keys pinned in a
// known_hosts file of kloud's.

// SSHHostPrefix starts the SSH host names of machines: kloud--<label>, or kloud--<id> when the
// label is not unique among the user's machines.
const SSHHostPrefix = "kloud--"

// SSHCiphers is the Ciphers line of config-ssh's entries: AES-GCM first. klient's SSH server
// (golang.org/x/crypto/ssh) moves about 3× as much with aes128-gcm as with OpenSSH's default
// chacha20-poly1305 (321 vs 103 MB/s, both ends in Go, loopback), and ssh picks the first of the
// client's list that the server has.
const SSHCiphers = "aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com,aes128-ctr,aes256-ctr"

// machineIDPattern is what a machine's id looks like (kloud's ids are 24 hex digits).
var machineIDPattern = regexp.MustCompile(`^[0-9a-f]{24}$`)

// The markers of the managed block in an ssh config.
const (
	sshBlockStart = "# ------------START-KLOUD-----------"
	sshBlockEnd   = "# ------------END-KLOUD------------"
)

// sshStdio pipes an SSH tunnel to machine host through stdin and stdout.
func (g *globals) sshStdio(ctx context.Context, host string) error {
	name := strings.TrimPrefix(host, SSHHostPrefix)
	cred, err := g.credential()
	if err != nil {
		return err
	}
	hc, err := g.httpClient()
	if err != nil {
		return err
	}
	// config-ssh's entries give the machine's id (HostName kloud--<id>): no lookup (a
	// machine.list) before every connection.
	id, label := name, name
	if !machineIDPattern.MatchString(name) {
		m, err := g.findMachine(ctx, name)
		if err != nil {
			return err
		}
		id, label = m.ID, m.Label
	}
	u := strings.TrimRight(g.url, "/") + "/api/machines/" + url.PathEscape(id) + "/ssh"
	t, err := dialForward(ctx, hc, "ws"+strings.TrimPrefix(u, "http"), cred)
	if err != nil {
		return fmt.Errorf("ssh to %s: %w", label, err)
	}
	defer t.Close()
	errc := make(chan error, 1)  // stdin to the machine
	readc := make(chan error, 1) // the machine to stdout: its end carries the close reason
	go func() {
		_, err := io.Copy(t, os.Stdin)
		if err == nil {
			err = t.CloseWrite()
		}
		errc <- err
	}()
	go func() {
		_, err := io.Copy(os.Stdout, t)
		readc <- err
	}()
	// The connection ends when the machine's side ends (ssh closes its stdin only after).
	select {
	case err := <-errc:
		if err != nil {
			// A write can fail first because the connection was closed, with the close frame
			// and its reason (a revoked share) in the reader's hands: take the reader's word.
			select {
			case rerr := <-readc:
				if rerr != nil {
					err = rerr
				}
			case <-time.After(2 * time.Second):
			}
		}
		return sshEnd(ctx, label, err)
	case err := <-readc:
		return sshEnd(ctx, label, err)
	case <-ctx.Done():
	}
	return nil
}

// sshEnd is what `kloud ssh --stdio` says when its connection ended with err: the agent's or
// kloud's close reason when there is one.
func sshEnd(ctx context.Context, label string, err error) error {
	var ce websocket.CloseError
	if errors.As(err, &ce) && ce.Reason != "" { // the agent's or kloud's reason (a revoked share)
		return fmt.Errorf("ssh to %s: %s", label, ce.Reason)
	}
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("ssh to %s: %w", label, err)
	}
	return nil
}

func configSSHCmd(g *globals) *cobra.Command {
	var o configSSHOptions
	cmd := &cobra.Command{
		Use:   "config-ssh",
		Short: "Write Host entries for your machines in ~/.ssh/config, for ssh, scp, rsync and IDEs",
		Long: `Write a block of Host entries, one per machine you may reach over SSH (yours, and those
shared with you with a terminal or full grant), between the lines
  ` + sshBlockStart + `
  ` + sshBlockEnd + `
of ~/.ssh/config (or --ssh-config). Each Host is kloud--<machine label> (kloud--<id> when two
of your machines share a label), with "ProxyCommand <this kloud> ssh --stdio %h": the
connection rides kloud to the machine's agent, which serves SSH itself, so no port of the
machine is open. The machines' host keys, as their agents report them to kloud, are pinned
in --known-hosts (StrictHostKeyChecking yes: no question on first use); kloud keeps them, so
a stopped machine keeps its entry. A machine whose agent never reported a key (older than SSH)
is skipped with a message: restart it, then run this again.

Running it again updates the block (and changes nothing when nothing changed); --remove
takes the block and the known_hosts file away; the rest of the file is kept as it is.`,
		Example: "  kloud config-ssh\n  ssh kloud--dev.0\n  code --remote ssh-remote+kloud--dev.0 /home/alice\n  kloud config-ssh --dry-run\n  kloud config-ssh --remove",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.configSSH(cmd.Context(), o)
		},
	}
	cmd.Flags().StringVar(&o.config, "ssh-config", "", "the ssh config file to write (default ~/.ssh/config)")
	cmd.Flags().StringVar(&o.knownHosts, "known-hosts", "", "the known_hosts file of the machines' host keys (default <data-dir>/known_hosts)")
	cmd.Flags().BoolVar(&o.remove, "remove", false, "remove the block and the known_hosts file")
	cmd.Flags().BoolVar(&o.dryRun, "dry-run", false, "print the change as a diff, write nothing")
	return cmd
}

type configSSHOptions struct {
	config, knownHosts string
	remove, dryRun     bool
}

// sshHost is one machine's Host entry.
type sshHost struct {
	Host      string `json:"host"`
	MachineID string `json:"machineId"`
	User      string `json:"user"`
	HostKey   string `json:"-"`
}

// sshSkipped is a machine config-ssh left out, and why.
type sshSkipped struct {
	Machine string `json:"machine"`
	Reason  string `json:"reason"`
}

func (g *globals) configSSH(ctx context.Context, o configSSHOptions) error {
	if o.config == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return fmt.Errorf("find ~/.ssh/config: %w (pass --ssh-config)", err)
		}
		o.config = filepath.Join(home, ".ssh", "config")
	}
	if real, err := filepath.EvalSymlinks(o.config); err == nil {
		o.config = real // a linked config (dotfiles) is written where it lives, the link stays
	}
	if o.knownHosts == "" {
		o.knownHosts = filepath.Join(g.dataDir, "known_hosts")
	}
	var err error
	if o.knownHosts, err = filepath.Abs(o.knownHosts); err != nil {
		return err
	}
	old, err := os.ReadFile(o.config)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("read %s: %w", o.config, err)
	}
	var hosts []sshHost
	var skipped []sshSkipped
	var block string
	if !o.remove {
		if hosts, skipped, err = g.sshHosts(ctx); err != nil {
			return err
		}
		if block, err = g.sshBlock(hosts, o.knownHosts); err != nil {
			return err
		}
	}
	next, err := replaceSSHBlock(string(old), block)
	if err != nil {
		return fmt.Errorf("%s: %w", o.config, err)
	}
	known := knownHostsText(hosts)
	changed := next != string(old)
	for _, s := range skipped {
		fmt.Fprintf(g.stderr, "skipped %s: %s\n", s.Machine, s.Reason)
	}
	if o.dryRun {
		if g.json {
			return g.printJSON(map[string]any{"sshConfig": o.config, "knownHosts": o.knownHosts, "hosts": nonNilSlice(hosts), "skipped": nonNilSlice(skipped), "changed": changed, "diff": lineDiff(o.config, string(old), next)})
		}
		fmt.Fprint(g.stdout, lineDiff(o.config, string(old), next))
		return nil
	}
	if changed {
		if err := writeKeepingMode(o.config, []byte(next)); err != nil {
			return err
		}
	}
	if o.remove {
		if err := os.Remove(o.knownHosts); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove %s: %w", o.knownHosts, err)
		}
	} else if cur, _ := os.ReadFile(o.knownHosts); string(cur) != known {
		if err := os.MkdirAll(filepath.Dir(o.knownHosts), 0o700); err != nil {
			return err
		}
		if err := writeKeepingMode(o.knownHosts, []byte(known)); err != nil {
			return err
		}
	}
	if g.json {
		return g.printJSON(map[string]any{"sshConfig": o.config, "knownHosts": o.knownHosts, "hosts": nonNilSlice(hosts), "skipped": nonNilSlice(skipped), "changed": changed})
	}
	switch {
	case o.remove && changed:
		fmt.Fprintf(g.stdout, "removed kloud's block from %s and %s\n", o.config, o.knownHosts)
	case o.remove:
		fmt.Fprintf(g.stdout, "%s has no kloud block\n", o.config)
	case !changed:
		fmt.Fprintf(g.stdout, "%s is up to date (%d hosts)\n", o.config, len(hosts))
	default:
		fmt.Fprintf(g.stdout, "wrote %d hosts to %s (host keys in %s):\n", len(hosts), o.config, o.knownHosts)
		for _, h := range hosts {
			fmt.Fprintf(g.stdout, "  ssh %s\n", h.Host)
		}
	}
	return nil
}

func nonNilSlice[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// sshHosts lists the caller's machines and asks kloud for each one's host key and account.
func (g *globals) sshHosts(ctx context.Context) ([]sshHost, []sshSkipped, error) {
	c, err := g.dial(ctx)
	if err != nil {
		return nil, nil, err
	}
	res, err := api.NewClient(c).MachineList(ctx, api.MachineListParams{})
	c.Close(nil)
	if err != nil {
		return nil, nil, explain(err)
	}
	cred, err := g.credential()
	if err != nil {
		return nil, nil, err
	}
	hc, err := g.httpClient()
	if err != nil {
		return nil, nil, err
	}
	labels := map[string]int{}
	for _, m := range res.Machines {
		labels[m.Label]++
	}
	var hosts []sshHost
	var skipped []sshSkipped
	for _, m := range res.Machines {
		var hk struct {
			HostKey string `json:"hostKey"`
			Account string `json:"account"`
		}
		u := strings.TrimRight(g.url, "/") + "/api/machines/" + url.PathEscape(m.ID) + "/ssh/hostkey"
		if err := getJSON(ctx, hc, u, cred, &hk); err != nil {
			skipped = append(skipped, sshSkipped{Machine: m.Label + " (" + m.ID + ")", Reason: err.Error()})
			continue
		}
		if hk.HostKey == "" || hk.Account == "" {
			skipped = append(skipped, sshSkipped{Machine: m.Label + " (" + m.ID + ")", Reason: "its agent has not reported an SSH host key yet"})
			continue
		}
		name := m.Label
		if labels[m.Label] > 1 || !validSSHName(name) {
			name = m.ID
		}
		hosts = append(hosts, sshHost{Host: SSHHostPrefix + name, MachineID: m.ID, User: hk.Account, HostKey: hk.HostKey})
	}
	slices.SortFunc(hosts, func(a, b sshHost) int { return strings.Compare(a.Host, b.Host) })
	return hosts, skipped, nil
}

// validSSHName says whether s can be part of a Host pattern and a known_hosts name as is.
func validSSHName(s string) bool {
	return s != "" && !strings.ContainsFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-' || r == '_')
	})
}

// getJSON GETs u with the bearer credential and decodes the answer; an error answer's message
// becomes the error.
func getJSON(ctx context.Context, hc *http.Client, u, cred string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+cred)
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		var e struct{ Error string }
		if json.Unmarshal(b, &e) != nil || e.Error == "" {
			e.Error = strings.TrimSpace(string(b))
		}
		return fmt.Errorf("%s", e.Error)
	}
	return json.Unmarshal(b, out)
}

// sshBlock is the managed block for hosts (with its markers and a final newline).
func (g *globals) sshBlock(hosts []sshHost, knownHosts string) (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find this kloud binary: %w", err)
	}
	key := g.key // what credential reads
	if key == "" {
		key = filepath.Join(g.dataDir, kloud.AdminKeyFile)
	}
	if key, err = filepath.Abs(key); err != nil {
		return "", err
	}
	proxy := []string{shellQuote(exe), "--url", shellQuote(g.url), "--key", shellQuote(key)}
	if g.caCert != "" {
		ca, err := filepath.Abs(g.caCert)
		if err != nil {
			return "", err
		}
		proxy = append(proxy, "--ca-cert", shellQuote(ca))
	}
	proxy = append(proxy, "ssh", "--stdio", "%h")
	var b strings.Builder
	b.WriteString(sshBlockStart + "\n")
	b.WriteString("# Written by `kloud config-ssh` for " + g.url + ": run it again to update, `kloud config-ssh --remove` to remove.\n")
	for _, h := range hosts {
		fmt.Fprintf(&b, "Host %s\n", h.Host)
		fmt.Fprintf(&b, "  HostName %s%s\n", SSHHostPrefix, h.MachineID) // %h: the id, no lookup
		fmt.Fprintf(&b, "  User %s\n", h.User)
		fmt.Fprintf(&b, "  ProxyCommand %s\n", strings.Join(proxy, " "))
		fmt.Fprintf(&b, "  HostKeyAlias %s\n", h.Host)
		fmt.Fprintf(&b, "  UserKnownHostsFile %q\n", knownHosts)
		b.WriteString("  StrictHostKeyChecking yes\n  CheckHostIP no\n  ForwardAgent no\n  ServerAliveInterval 30\n")
		b.WriteString("  Ciphers " + SSHCiphers + "\n")
	}
	b.WriteString(sshBlockEnd + "\n")
	return b.String(), nil
}

// knownHostsText is the known_hosts file of hosts: "<alias> <key>" per host.
func knownHostsText(hosts []sshHost) string {
	var b strings.Builder
	for _, h := range hosts {
		fmt.Fprintf(&b, "%s %s\n", h.Host, h.HostKey)
	}
	return b.String()
}

// replaceSSHBlock puts block ("" : none) in place of the managed block of config, or appends it
// when config has none. Everything outside the block is kept byte for byte (a file that does
// not end with a newline gets one before an appended block).
func replaceSSHBlock(config, block string) (string, error) {
	start := strings.Index(config, sshBlockStart+"\n")
	if start > 0 && config[start-1] != '\n' {
		start = -1 // not at a line start: not ours
	}
	if start < 0 {
		if strings.Contains(config, sshBlockEnd) {
			return "", errors.New("it has kloud's end marker but no start marker: fix the file by hand")
		}
		if block == "" {
			return config, nil
		}
		if config != "" && !strings.HasSuffix(config, "\n") {
			config += "\n"
		}
		return config + block, nil
	}
	rest := config[start:]
	end := strings.Index(rest, sshBlockEnd)
	if end < 0 {
		return "", errors.New("it has kloud's start marker but no end marker: fix the file by hand")
	}
	end += len(sshBlockEnd)
	if end < len(rest) && rest[end] == '\n' {
		end++
	}
	return config[:start] + block + rest[end:], nil
}

// lineDiff is a unified-style diff of old and next (the lines between their common start and
// end), "" when they are equal.
func lineDiff(name, old, next string) string {
	if old == next {
		return ""
	}
	a, b := splitLines(old), splitLines(next)
	p := 0
	for p < len(a) && p < len(b) && a[p] == b[p] {
		p++
	}
	s := 0
	for s < len(a)-p && s < len(b)-p && a[len(a)-1-s] == b[len(b)-1-s] {
		s++
	}
	var out bytes.Buffer
	fmt.Fprintf(&out, "--- %s\n+++ %s (kloud config-ssh)\n@@ -%d,%d +%d,%d @@\n", name, name, p+1, len(a)-p-s, p+1, len(b)-p-s)
	for _, l := range a[p : len(a)-s] {
		out.WriteString("-" + l + "\n")
	}
	for _, l := range b[p : len(b)-s] {
		out.WriteString("+" + l + "\n")
	}
	return out.String()
}

func splitLines(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(strings.TrimSuffix(s, "\n"), "\n")
}

// writeKeepingMode writes b to path through a temporary file, keeping path's mode (0600 for
// a new file; its directory is made 0700).
func writeKeepingMode(path string, b []byte) error {
	mode := os.FileMode(0o600)
	if fi, err := os.Stat(path); err == nil {
		mode = fi.Mode().Perm()
	} else if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".kloud-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
