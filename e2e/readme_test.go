package e2e

// TestReadme runs the documentation's examples as written: the README's tour and the blocks of
// docs/user-guide.md and docs/admin-guide.md marked "```sh tested", parsed out of the files (so a
// change to the documents is what is tested), each line through sh with the real kloud CLI as
// bin/kloud, against a real kloud serve on a clean data dir (~/.kloud of a home of the test's)
// with the local provider and its demo template. One demo stack is built: the README's tour
// runs up to its `stack destroy`, then the guides' blocks on that stack, then the rest of the
// tour. Every command must exit 0 and say what it is meant to (docChecks); a tested command
// without a check fails the test. TestDocsDocker and TestDocsVagrant build the user guide's
// docker and vagrant templates ("```hcl tested docker", written to main.tf) with its
// "```sh tested docker" (vagrant) commands.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kloud/cli"
	"github.com/kloud-dev/kloud/providers/local/tfprovider/tfprovidertest"
)

// docCommand is one line of a tested block.
type docCommand struct {
	file  string
	line  int
	block int // the block's index in its file
	text  string
}

func (c docCommand) String() string { return fmt.Sprintf("%s:%d: %s", c.file, c.line, c.text) }

// docBlock is a fenced block of a document: its text, and its command lines.
type docBlock struct {
	text string
	cmds []docCommand
}

// fencedBlocks returns file's blocks whose fence is "```"+info (path relative to the module
// root), with their command lines: blank lines and comment lines left out. It fails the test
// when there is none.
func fencedBlocks(t *testing.T, file, info string) []docBlock {
	t.Helper()
	f, err := os.Open(filepath.Join("..", file))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var blocks []docBlock
	in := false
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		raw := sc.Text()
		l := strings.TrimSpace(raw)
		switch {
		case !in && l == "```"+info:
			in = true
			blocks = append(blocks, docBlock{})
		case in && l == "```":
			in = false
		case in:
			b := &blocks[len(blocks)-1]
			b.text += raw + "\n"
			if l != "" && !strings.HasPrefix(l, "#") {
				b.cmds = append(b.cmds, docCommand{file: file, line: n, block: len(blocks) - 1, text: l})
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if in {
		t.Fatalf("%s: a ```%s block is not closed", file, info)
	}
	if len(blocks) == 0 {
		t.Fatalf("%s: no ```%s block", file, info)
	}
	return blocks
}

// stripComment returns the line without its trailing shell comment (a # that starts a word
// outside quotes).
func stripComment(l string) string {
	var quote rune
	for i, r := range l {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			}
		case r == '\'' || r == '"':
			quote = r
		case r == '#' && (i == 0 || l[i-1] == ' ' || l[i-1] == '\t'):
			return strings.TrimSpace(l[:i])
		}
	}
	return strings.TrimSpace(l)
}

// docRun is the documentation's reader: a working directory with bin/kloud, a home whose
// ~/.kloud is kloud's data dir, the environment the lines run in and the ids the documents
// call ID, STACK and SNAPSHOT.
type docRun struct {
	e       *env
	dir, pw string
	env     []string
	vars    map[string]string
}

var placeholder = regexp.MustCompile(`\b(ID|STACK|SNAPSHOT)\b`)

// run runs command c through sh and returns its output (stdout and stderr), failing the test
// unless it exits 0; the password the test uses is its stdin (what a user types at a prompt).
func (r *docRun) run(c docCommand) string {
	t := r.e.t
	t.Helper()
	code := stripComment(c.text)
	var missing []string
	code = placeholder.ReplaceAllStringFunc(code, func(p string) string {
		v, ok := r.vars[p]
		if !ok {
			missing = append(missing, p)
		}
		return v
	})
	if len(missing) > 0 {
		t.Fatalf("%s: %v not known yet (no command before printed it)", c, missing)
	}
	if name, ok := strings.CutPrefix(code, "export "); ok {
		name, _, _ = strings.Cut(name, "=")
		out := r.sh(c, code+`; printf %s "$`+name+`"`)
		r.env = append(r.env, name+"="+out)
		return out
	}
	return r.sh(c, code)
}

func (r *docRun) sh(c docCommand, code string) string {
	t := r.e.t
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-c", code)
	cmd.Dir, cmd.Env = r.dir, r.env
	cmd.Stdin = strings.NewReader(r.pw + "\n")
	start := time.Now()
	out, err := cmd.CombinedOutput()
	t.Logf("%s (%s)\n%s", c, time.Since(start).Round(time.Millisecond), out)
	if err != nil {
		t.Fatalf("%s: %v\n%s", c, err, out)
	}
	return string(out)
}

// docCheck is what a documented command must do: the text its output contains, and then what
// after checks (it may also record the ids it printed).
type docCheck struct {
	cmd   *regexp.Regexp // matches the command as written (comment and all)
	want  []string
	after func(r *docRun, out string)
}

var docChecks = []docCheck{
	// The README's tour.
	{cmd: regexp.MustCompile(`^bin/kloud template list\b`), want: []string{"Demo: two local machines"}, after: func(r *docRun, out string) {
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, "Demo: two local machines") {
				r.vars["ID"] = strings.Fields(l)[0]
			}
		}
	}},
	{cmd: regexp.MustCompile(`^bin/kloud template create --title \w+ --file main.tf\b`), want: []string{"created"}, after: func(r *docRun, out string) {
		m := regexp.MustCompile(`template (\S+) created`).FindStringSubmatch(out)
		if m == nil {
			r.e.t.Fatalf("template create printed no template id:\n%s", out)
		}
		r.vars["ID"] = m[1]
	}},
	{cmd: regexp.MustCompile(`^bin/kloud stack create --template ID\b`), want: []string{"created with 2 machines", "dev.0", "dev.1"}, after: func(r *docRun, out string) {
		m := regexp.MustCompile(`stack (\S+) created`).FindStringSubmatch(out)
		if m == nil {
			r.e.t.Fatalf("stack create printed no stack id:\n%s", out)
		}
		r.vars["STACK"] = m[1]
	}},
	{cmd: regexp.MustCompile(`^bin/kloud stack apply STACK\b`), want: []string{"Stack building finished"}, after: func(r *docRun, out string) {
		r.running("dev.0", "dev.1")
	}},
	{cmd: regexp.MustCompile(`^bin/kloud machine list\s*(#|$)`), want: []string{"dev.0", "dev.1", "Running", "connected", "10.200."}},
	{cmd: regexp.MustCompile(`^bin/kloud bucket list\s*(#|$)`), want: []string{"shared", "ready", "STACK"}},
	// The demo's bucket: dev.0 puts its motd there, dev.1 reads it back (both as the owner's
	// login shell, which has the bucket's endpoint and key).
	{cmd: regexp.MustCompile(`^echo 'curl -sT /etc/motd [^']*' \| bin/kloud ssh dev\.0\b`), after: func(r *docRun, out string) {
		if strings.Contains(out, "<Error>") || strings.Contains(out, "exited with status") {
			r.e.t.Errorf("the upload to the demo's bucket failed:\n%s", out)
		}
	}},
	{cmd: regexp.MustCompile(`^echo 'curl -s --aws-sigv4 [^']*' \| bin/kloud ssh dev\.1\b`), want: []string{"MOTD"}},
	{cmd: regexp.MustCompile(`^echo 'cat /etc/motd; exit' \| bin/kloud ssh dev\.0\b`), want: []string{"MOTD"}, after: func(r *docRun, out string) {
		if strings.Contains(out, "No such file") || strings.Contains(out, "Permission denied") || strings.Contains(out, "exited with status") {
			r.e.t.Errorf("the shell could not read the file:\n%s", out)
		}
	}},
	// OpenSSH through kloud (ssh is the test's shim: OpenSSH reads ~/.ssh/config of the passwd
	// entry's home, the test's home stands in for it; newDocRun).
	{cmd: regexp.MustCompile(`^bin/kloud config-ssh\s*(#|$)`), want: []string{"wrote 2 hosts to", "ssh kloud--dev.0", "ssh kloud--dev.1"}},
	{cmd: regexp.MustCompile(`^ssh kloud--dev\.0 cat /etc/motd\b`), want: []string{"MOTD"}},
	{cmd: regexp.MustCompile(`^bin/kloud machine stop dev.0 && bin/kloud machine start dev.0\b`), after: func(r *docRun, out string) {
		r.running("dev.0", "dev.1")
	}},
	{cmd: regexp.MustCompile(`^bin/kloud machine snapshot dev.0 --name clean\b`), after: func(r *docRun, out string) {
		f := strings.Fields(out)
		if len(f) == 0 {
			r.e.t.Fatalf("machine snapshot printed no id")
		}
		r.vars["SNAPSHOT"] = f[len(f)-1]
		r.running("dev.0")
	}},
	{cmd: regexp.MustCompile(`^bin/kloud machine snapshots\s*(#|$)`), want: []string{"clean", "SNAPSHOT", "used 1 of 10 snapshots"}},
	{cmd: regexp.MustCompile(`^bin/kloud machine restore SNAPSHOT && bin/kloud snapshot delete SNAPSHOT\b`), after: func(r *docRun, out string) {
		r.running("dev.0")
		var list struct{ Snapshots []struct{ ID string } }
		r.e.runJSON(&list, "machine", "snapshots")
		if len(list.Snapshots) != 0 {
			r.e.t.Errorf("snapshots after delete: %+v", list.Snapshots)
		}
	}},
	{cmd: regexp.MustCompile(`^bin/kloud user passwd admin\b`), want: []string{"password of admin set"}},
	{cmd: regexp.MustCompile(`^bin/kloud stack destroy STACK\b`), after: func(r *docRun, out string) {
		if ms := r.e.machines(r.vars["STACK"]); len(ms) != 0 {
			r.e.t.Errorf("machines after destroy: %+v", ms)
		}
	}},
	{cmd: regexp.MustCompile(`^bin/kloud --help\b`), want: []string{"Usage:", "stack", "machine"}},

	// docs/user-guide.md
	{cmd: regexp.MustCompile(`^bin/kloud provider list\b`), want: []string{"local", "snapshot"}},
	{cmd: regexp.MustCompile(`^bin/kloud provider describe local\b`), want: []string{"local", "cpus", "memory"}},
	{cmd: regexp.MustCompile(`^bin/kloud stack plan --template ID\b`), want: []string{"dev.0", "dev.1", "local"}},
	{cmd: regexp.MustCompile(`^bin/kloud template update ID --file main.tf\b`), want: []string{"ID", "is at rev"}},
	{cmd: regexp.MustCompile(`^bin/kloud template get ID\b`), want: []string{"ID", "--- main.tf", "kloudlocal_machine"}},
	// idle stop (kloud/idle.go): before the plain machine info's check
	{cmd: regexp.MustCompile(`^bin/kloud machine set dev.0 --idle-timeout 30m\b`), want: []string{"dev.0", "30m idle"}},
	{cmd: regexp.MustCompile(`^bin/kloud machine set dev.0 --always-on\b`), want: []string{"dev.0", "always on"}},
	{cmd: regexp.MustCompile(`^bin/kloud machine info dev.0\s+# idle`), want: []string{"dev.0", "Running", "idle:   always on"}},
	{cmd: regexp.MustCompile(`^bin/kloud machine info dev.0\b`), want: []string{"dev.0", "Running"}},
	{cmd: regexp.MustCompile(`^bin/kloud machine stop dev.0\s*(#|$)`), after: func(r *docRun, out string) {
		if m := r.e.machines(r.vars["STACK"])["dev.0"]; m.State != "Stopped" {
			r.e.t.Errorf("dev.0 after stop: %+v", m)
		}
	}},
	{cmd: regexp.MustCompile(`^bin/kloud machine start dev.0\s*(#|$)`), after: func(r *docRun, out string) {
		r.running("dev.0", "dev.1")
	}},
	{cmd: regexp.MustCompile(`^bin/kloud machine ports open dev.0 8000 --from team\b`), want: []string{"8000", "team"}},
	{cmd: regexp.MustCompile(`^bin/kloud machine ports dev.0\b`), want: []string{"8000", "team"}},
	{cmd: regexp.MustCompile(`^bin/kloud machine ports close dev.0 8000\s*(#|$)`), after: func(r *docRun, out string) {
		if out, err := r.e.try("machine", "ports", "dev.0"); err != nil || strings.Contains(out, "8000") {
			r.e.t.Errorf("machine ports after close (err %v):\n%s", err, out)
		}
	}},
	{cmd: regexp.MustCompile(`^bin/kloud user add bob --team default\b`), want: []string{"added user bob"}},
	{cmd: regexp.MustCompile(`^bin/kloud machine share dev.0 bob --grant terminal\b`), want: []string{"bob", "terminal"}},
	{cmd: regexp.MustCompile(`^bin/kloud machine shares dev.0\b`), want: []string{"bob", "terminal"}},
	{cmd: regexp.MustCompile(`^bin/kloud machine unshare dev.0 bob\b`), after: func(r *docRun, out string) {
		if out := r.e.run("machine", "shares", "dev.0"); strings.Contains(out, "bob") {
			r.e.t.Errorf("shares after unshare:\n%s", out)
		}
	}},
	{cmd: regexp.MustCompile(`^bin/kloud stack scale STACK dev 3\b`), want: []string{"dev.2"}, after: func(r *docRun, out string) {
		r.running("dev.0", "dev.1", "dev.2")
	}},
	{cmd: regexp.MustCompile(`^bin/kloud machine list --stack STACK\b`), want: []string{"dev.0", "dev.1", "dev.2"}},

	// docs/admin-guide.md
	{cmd: regexp.MustCompile(`^bin/kloud user add alice --password --team default\b`), want: []string{"added user alice", "kloud login --username alice"}},
	{cmd: regexp.MustCompile(`^bin/kloud login --username alice\b`), after: func(r *docRun, out string) {
		if _, err := os.Stat(filepath.Join(r.e.dir, "session")); err != nil {
			r.e.t.Errorf("login wrote no session: %v\n%s", err, out)
		}
	}},
	{cmd: regexp.MustCompile(`^export KLOUD_KEY=~/.kloud/session\b`), after: func(r *docRun, out string) {
		if out != filepath.Join(r.dir, "home", ".kloud", "session") {
			r.e.t.Errorf("KLOUD_KEY=%s", out)
		}
	}},
	{cmd: regexp.MustCompile(`^bin/kloud whoami\b`), want: []string{"alice"}},
	{cmd: regexp.MustCompile(`^bin/kloud team create red && bin/kloud team add-member red bob\b`), want: []string{"red", "bob"}},
	{cmd: regexp.MustCompile(`^bin/kloud logout\b`), after: func(r *docRun, out string) {
		if _, err := os.Stat(filepath.Join(r.e.dir, "session")); !os.IsNotExist(err) {
			r.e.t.Errorf("the session after logout: %v", err)
		}
	}},
	{cmd: regexp.MustCompile(`^bin/kloud template trust ID --allow provisioner\b`), want: []string{"trusted by admin", "provisioner"}},
	{cmd: regexp.MustCompile(`^bin/kloud template untrust ID\b`), want: []string{"1 trusted revision(s) untrusted"}},
	{cmd: regexp.MustCompile(`^bin/kloud user add alice --team default\b`), want: []string{"added user alice to default"}},
	{cmd: regexp.MustCompile(`^bin/kloud key create --username alice --out alice.key\b`), want: []string{"wrote kite key for alice"}, after: func(r *docRun, out string) {
		if _, err := os.Stat(filepath.Join(r.dir, "alice.key")); err != nil {
			r.e.t.Errorf("alice's key: %v", err)
		}
	}},
	{cmd: regexp.MustCompile(`^bin/kloud gc --dry-run\b`)},
	{cmd: regexp.MustCompile(`^bin/kloud gc\s*(#|$)`), after: func(r *docRun, out string) {
		r.running("dev.0", "dev.1", "dev.2") // nothing of the stack is garbage
	}},
	{cmd: regexp.MustCompile(`^bin/kloud kites\b`), want: []string{"klient"}},
	{cmd: regexp.MustCompile(`^bin/kloud job list\b`), want: []string{"succeeded"}},
	{cmd: regexp.MustCompile(`^bin/kloud stack list --all\b`), want: []string{"STACK", "Initialized"}},
}

// checkOf returns the check of the documented command text, or nil.
func checkOf(text string) *docCheck {
	for i := range docChecks {
		if docChecks[i].cmd.MatchString(text) {
			return &docChecks[i]
		}
	}
	return nil
}

// check runs command c's check on its output.
func (r *docRun) check(c docCommand, out string) {
	t := r.e.t
	t.Helper()
	ch := checkOf(c.text)
	if ch == nil {
		t.Errorf("%s: no check for this documented command: add one to docChecks", c)
		return
	}
	for _, w := range ch.want {
		if v, ok := r.vars[w]; ok {
			w = v
		}
		if !strings.Contains(out, w) {
			t.Errorf("%s: the output lacks %q:\n%s", c, w, out)
		}
	}
	if ch.after != nil {
		ch.after(r, out)
	}
}

// TestDocsChecked needs no kloud: every tested command of the README and the guides has its
// check in docChecks (so a new example fails here at once, also where TestReadme skips).
func TestDocsChecked(t *testing.T) {
	parallel(t)
	n := 0
	for _, f := range []struct{ file, info string }{
		{"README.md", "sh tested"}, {"docs/user-guide.md", "sh tested"}, {"docs/admin-guide.md", "sh tested"},
		{"docs/user-guide.md", "sh tested docker"}, {"docs/user-guide.md", "sh tested vagrant"},
		{"docs/admin-guide.md", "sh tested vagrant-host"},
	} {
		for _, b := range fencedBlocks(t, f.file, f.info) {
			for _, c := range b.cmds {
				n++
				if checkOf(c.text) == nil {
					t.Errorf("%s: no check for this documented command: add one to docChecks", c)
				}
			}
		}
	}
	t.Logf("%d documented commands, each with its check", n)
}

// running checks that the machines labelled labels of the stack run with their agents connected.
func (r *docRun) running(labels ...string) {
	t := r.e.t
	t.Helper()
	ms := r.e.machines(r.vars["STACK"])
	for _, l := range labels {
		if m := ms[l]; m.State != "Running" || m.Agent.Status != "connected" {
			t.Errorf("%s: %+v", l, m)
		}
	}
}

// block runs the commands of one tested block in order; exports end with the block.
func (r *docRun) block(cmds []docCommand) {
	r.e.t.Helper()
	saved := r.env
	r.env = append([]string(nil), r.env...)
	for _, c := range cmds {
		r.check(c, r.run(c))
	}
	r.env = saved
}

// newDocRun is the documentation's reader for kloud e: a working directory with bin/kloud, and a
// home whose ~/.kloud is kloud's data dir; the CLI uses the admin's key there unless key is set
// (the KLOUD_KEY of a user's set-up).
func newDocRun(t *testing.T, e *env, key string) *docRun {
	t.Helper()
	dir := t.TempDir()
	home := filepath.Join(dir, "home")
	for _, err := range []error{os.MkdirAll(filepath.Join(dir, "bin"), 0o755), os.MkdirAll(home, 0o755),
		os.Symlink(filepath.Join(bin, "kloud"), filepath.Join(dir, "bin", "kloud")),
		os.Symlink(e.dir, filepath.Join(home, ".kloud"))} {
		if err != nil {
			t.Fatal(err)
		}
	}
	r := &docRun{e: e, dir: dir, pw: "a-documented-password", vars: map[string]string{}}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KLOUD_") && !strings.HasPrefix(kv, "HOME=") {
			r.env = append(r.env, kv)
		}
	}
	// OpenSSH takes ~/.ssh/config from the passwd entry's home, not $HOME: a shim before it in
	// PATH gives it the test's home's config (which bin/kloud config-ssh writes there).
	if sshBin, err := exec.LookPath("ssh"); err == nil {
		shims := filepath.Join(dir, "shims")
		shim := "#!/bin/sh\nexec " + sshBin + " -F \"$HOME/.ssh/config\" \"$@\"\n"
		if err := errors.Join(os.MkdirAll(shims, 0o755), os.WriteFile(filepath.Join(shims, "ssh"), []byte(shim), 0o755)); err != nil {
			t.Fatal(err)
		}
		for i, kv := range r.env {
			if p, ok := strings.CutPrefix(kv, "PATH="); ok {
				r.env[i] = "PATH=" + shims + ":" + p
			}
		}
	}
	// The test's kloud does not listen on 127.0.0.1:7000.
	r.env = append(r.env, "HOME="+home, "KLOUD_URL="+e.url())
	if key != "" {
		r.env = append(r.env, "KLOUD_KEY="+key)
	}
	return r
}

func TestReadme(t *testing.T) {
	parallel(t)
	tour := fencedBlocks(t, "README.md", "sh tested")
	if len(tour) != 1 {
		t.Fatalf("README.md has %d tested blocks, want one: the tour", len(tour))
	}
	guides := append(fencedBlocks(t, "docs/user-guide.md", "sh tested"), fencedBlocks(t, "docs/admin-guide.md", "sh tested")...)
	destroy := -1
	for i, c := range tour[0].cmds {
		if strings.HasPrefix(c.text, "bin/kloud stack destroy ") && destroy < 0 {
			destroy = i
		}
	}
	if destroy < 0 {
		t.Fatal("the README's tour does not destroy its stack")
	}

	h := tfprovidertest.NewHost(t) // gates on root, ip, nsenter, the base image; removes it all at the end
	_, port, _ := net.SplitHostPort(testutil.FreeLoopback(t))
	addr := net.JoinHostPort(h.HostAddr().String(), port)
	e := newTerraformerEnv(t, addr, kloudlocalMirror(t), "--public-url", "http://"+addr, "--s3", "auto", // make run's S3 server: the demo's bucket
		"--local-state-dir", h.StateDir, "--local-bridge", h.Bridge, "--local-subnet", h.Subnet.String())
	// What make run prints on a fresh install.
	if out := e.kloudOut.String(); !strings.Contains(out, "created the demo template") ||
		!strings.Contains(out, "To build the demo stack") || strings.Contains(out, "cannot run here") {
		t.Fatalf("kloud serve on a clean data dir did not offer the demo:\n%s", out)
	}

	r := newDocRun(t, e, "")
	r.vars["MOTD"] = "Welcome to dev-0, built by Kloud" // the demo template's user data
	// The user guide's template, where its commands expect it (and it is the demo's, as it says).
	tf := fencedBlocks(t, "docs/user-guide.md", "hcl tested local")[0].text
	if want := strings.SplitN(cli.DemoTemplate, "\n", 2)[1]; tf != want {
		t.Errorf("the user guide's template is not the demo template:\n%s\nwant:\n%s", tf, want)
	}
	if err := os.WriteFile(filepath.Join(r.dir, "main.tf"), []byte(tf), 0o644); err != nil {
		t.Fatal(err)
	}
	r.block(tour[0].cmds[:destroy])
	for _, b := range guides {
		r.block(b.cmds)
	}
	r.block(tour[0].cmds[destroy:])
}

// TestDocsDocker builds the user guide's docker template with its commands, on a private dockerd.
func TestDocsDocker(t *testing.T) {
	parallel(t)
	tf := fencedBlocks(t, "docs/user-guide.md", "hcl tested docker")
	cmds := fencedBlocks(t, "docs/user-guide.md", "sh tested docker")
	e := newDockerEnv(t)
	r := newDocRun(t, e.env, "")
	r.vars["MOTD"] = "hello from dev-0" // the template's user data
	if err := os.WriteFile(filepath.Join(r.dir, "main.tf"), []byte(tf[0].text), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, b := range cmds {
		r.block(b.cmds)
	}
	if left := e.leftovers(); len(left) > 0 {
		t.Errorf("left on the daemon: %q", left)
	}
}

// TestDocsVagrant builds the user guide's vagrant template with its commands, as alice, on her
// vagrant host: the administrator guide's commands for a vagrant host make her and her key, with
// which the test runs her klient --vagrant (the user guide's host set-up, whose base image the
// test imports into the docker daemon of Vagrant's docker provider, as kloud/machine:bookworm).
func TestDocsVagrant(t *testing.T) {
	parallel(t)
	tf := fencedBlocks(t, "docs/user-guide.md", "hcl tested vagrant")
	cmds := fencedBlocks(t, "docs/user-guide.md", "sh tested vagrant")
	admin := fencedBlocks(t, "docs/admin-guide.md", "sh tested vagrant-host")
	var r *docRun
	e := newVagrantEnvUsers(t, func(e *env) {
		r = newDocRun(t, e, "")
		for _, b := range admin {
			r.block(b.cmds)
		}
		e.key = filepath.Join(r.dir, "alice.key")
	})
	e.d.Docker(t, "tag", vagrantImage, "kloud/machine:bookworm") // the same base image, under the guide's name
	r.env = append(r.env, "KLOUD_KEY="+e.key)                    // the guide's export KLOUD_KEY=$PWD/alice.key
	r.vars["MOTD"] = "hello from dev-0"                          // the template's user data
	if err := os.WriteFile(filepath.Join(r.dir, "main.tf"), []byte(tf[0].text), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, b := range cmds {
		r.block(b.cmds)
	}
	if c := e.d.Containers(t); len(c) != 0 {
		t.Errorf("containers after destroy: %v", c)
	}
}
