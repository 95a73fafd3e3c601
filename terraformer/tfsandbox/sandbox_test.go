package tfsandbox_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/terraformer/tfrun"
	"github.com/kloud-dev/kloud/terraformer/tfrun/tfruntest"
	"github.com/kloud-dev/kloud/terraformer/tfsandbox"
)

// TestMain: this test binary is the launcher of the engines these tests start.
func TestMain(m *testing.M) {
	tfsandbox.MaybeRun()
	os.Exit(m.Run())
}

const jobTimeout = 2 * time.Minute

// These tests run templates straight through tfrun: the "trusted path" with no template policy in
// front, standing for a template that got through it. The sandbox alone must hold.

// plantSecret writes a world-readable secret into a fresh directory outside the engine's, standing
// for kloud's data dir: file modes do not protect it, only the sandbox's mount namespace does.
func plantSecret(t *testing.T) (path, secret string) {
	t.Helper()
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	secret = "kloud-signing-key-" + fmt.Sprint(time.Now().UnixNano())
	path = filepath.Join(dir, "kloud.key")
	if err := os.WriteFile(path, []byte(secret), 0o644); err != nil {
		t.Fatal(err)
	}
	return path, secret
}

func apply(t *testing.T, e *tfrun.Engine, contentID, main string) *tfrun.Job {
	t.Helper()
	j, err := e.Submit(t.Context(), tfrun.Request{Op: tfrun.OpApply, ContentID: contentID,
		Files: map[string][]byte{"main.tf": []byte(main)}})
	if err != nil {
		t.Fatalf("submit %s: %v", contentID, err)
	}
	return tfruntest.Wait(t, e, j.ID, jobTimeout)
}

// TestTemplateCannotReadHostFiles: data "local_file" and file() of a host file outside the work
// dir fail, and the secret appears nowhere in the job.
func TestTemplateCannotReadHostFiles(t *testing.T) {
	t.Parallel()
	e := tfruntest.NewEngine(t, tfrun.Options{})
	path, secret := plantSecret(t)
	for name, main := range map[string]string{
		"data-local-file": fmt.Sprintf(`
data "local_file" "key" { filename = %q }
resource "terraform_data" "leak" { input = data.local_file.key.content }
output "leak" { value = data.local_file.key.content }`, path),
		"file-function": fmt.Sprintf(`
resource "terraform_data" "leak" { input = file(%q) }
output "leak" { value = file(%q) }`, path, path),
	} {
		j := apply(t, e, name, main)
		if j.Status != tfrun.StatusFailed {
			t.Errorf("%s: status %s, want failed (the file must not be visible); outputs %+v", name, j.Status, j.Result)
			continue
		}
		b, _ := os.ReadFile(filepath.Join(e.Options().Dir, "jobs", j.ID+".log"))
		if strings.Contains(string(b), secret) || strings.Contains(fmt.Sprint(j), secret) {
			t.Errorf("%s: the secret is in the job", name)
		}
		if !strings.Contains(j.Err().Error(), "no such file") && !strings.Contains(j.Err().Error(), "not exist") &&
			!strings.Contains(j.Err().Error(), "Invalid") {
			t.Errorf("%s: error %v", name, j.Err())
		}
		t.Logf("%s: %v", name, j.Err())
	}
	// fileset() of a directory that is not there is empty: terraformer's jobs (other stacks' logs)
	// are not in the sandbox, though they are on the host.
	j := apply(t, e, "terraformer-jobs", fmt.Sprintf(`output "leak" { value = fileset(%q, "*") }`,
		filepath.Join(e.Options().Dir, "jobs")))
	if j.Status != tfrun.StatusSucceeded || fmt.Sprint(j.Result.Outputs["leak"].Value) != "[]" {
		t.Errorf("fileset of terraformer's jobs dir: %s %v %+v", j.Status, j.Err(), j.Result)
	}
	if entries, _ := os.ReadDir(filepath.Join(e.Options().Dir, "jobs")); len(entries) == 0 {
		t.Error("the host's jobs dir is empty: the check above proves nothing")
	}
}

// TestProvisionerConfined runs a local-exec provisioner (which the template policy refuses, but
// here it got through) that reports what it can do into files in its work dir.
func TestProvisionerConfined(t *testing.T) {
	t.Parallel()
	e := tfruntest.NewEngine(t, tfrun.Options{})
	path, secret := plantSecret(t)

	// Another stack, with a file in its work dir.
	other := apply(t, e, "other", `
resource "local_file" "f" {
  content  = "other stack's secret"
  filename = "${path.module}/secret.txt"
}`)
	if other.Status != tfrun.StatusSucceeded {
		t.Fatalf("other stack: %s %v", other.Status, other.Err())
	}
	otherWork := tfruntest.WorkDir(e, "other")
	hostTmp := "tfsandbox-escape-" + fmt.Sprint(time.Now().UnixNano())
	t.Cleanup(func() { os.Remove(filepath.Join(os.TempDir(), hostTmp)) })

	// Each check writes "yes" or "no" (or a value) into a file named after it.
	script := strings.Join([]string{
		`id -u > uid`,
		`id -g > gid`,
		`id -G > groups`,
		`grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs):' /proc/self/status > status`,
		`cat /proc/1/cmdline | tr '\0' ' ' > pid1`,
		`ls /proc | grep -c '^[0-9]' > nprocs`,
		`echo $HOME > home`,
		check("read-secret", "cat "+path),
		check("see-secret-dir", "test -e "+filepath.Dir(path)),
		check("root-exists", "test -e /root"),
		check("read-other-stack", "cat "+filepath.Join(otherWork, "secret.txt")),
		check("list-other-stack", "ls "+otherWork),
		check("list-jobs", "ls "+filepath.Join(e.Options().Dir, "jobs")),
		check("home-exists", "test -e /home/."),
		check("var-lib-kloud", "test -e /var/lib/kloud"),
		check("write-etc", "touch /etc/tfsandbox-test"),
		check("write-usr", "touch /usr/tfsandbox-test"),
		check("write-root-dir", "touch /tfsandbox-test"),
		check("write-engine-dir", "touch "+filepath.Join(e.Options().Dir, "tfsandbox-test")),
		check("write-tmp", "touch /tmp/"+hostTmp),
		check("write-work", "touch ./written"),
		check("mount", "mount -t tmpfs none /tmp"),
	}, "\n")
	j, work, read := probe(t, e, "confined", script)
	if got := read("uid"); got != "65534" {
		t.Errorf("uid %s, want 65534", got)
	}
	if got := read("gid"); got != "65534" {
		t.Errorf("gid %s, want 65534", got)
	}
	if got := read("groups"); got != "65534" {
		t.Errorf("groups %q, want only 65534", got)
	}
	status := read("status")
	for _, line := range strings.Split(status, "\n") {
		name, val, _ := strings.Cut(line, ":")
		val = strings.TrimSpace(val)
		want := "0000000000000000"
		if name == "NoNewPrivs" {
			want = "1"
		}
		if val != want {
			t.Errorf("%s: %s, want %s", name, val, want)
		}
	}
	if !strings.Contains(status, "CapEff") || !strings.Contains(status, "CapBnd") {
		t.Errorf("/proc/self/status lines: %q", status)
	}
	if got := read("pid1"); !strings.HasPrefix(got, "tfsandbox-init") {
		t.Errorf("pid 1 in the sandbox is %q, want tfsandbox-init (own pid namespace)", got)
	}
	if got := read("home"); got != "/tmp" {
		t.Errorf("HOME %q", got)
	}
	for _, name := range []string{"read-secret", "see-secret-dir", "root-exists", "read-other-stack", "list-other-stack",
		"list-jobs", "home-exists", "var-lib-kloud", "write-etc", "write-usr", "write-root-dir", "write-engine-dir", "mount"} {
		if got := read(name); got != "no" {
			t.Errorf("%s: %s, want no", name, got)
		}
	}
	for _, name := range []string{"write-tmp", "write-work"} {
		if got := read(name); got != "yes" {
			t.Errorf("%s: %s, want yes", name, got)
		}
	}
	// /tmp is the sandbox's own.
	if _, err := os.Stat(filepath.Join(os.TempDir(), hostTmp)); err == nil {
		t.Errorf("the provisioner's /tmp file appeared in the host's /tmp")
	}
	if fi, err := os.Stat(filepath.Join(work, "written")); err != nil {
		t.Errorf("work dir file: %v", err)
	} else if uid := fileUID(fi); uid != 65534 {
		t.Errorf("work dir file owned by uid %d", uid)
	}
	b, _ := os.ReadFile(filepath.Join(e.Options().Dir, "jobs", j.ID+".log"))
	if strings.Contains(string(b), secret) {
		t.Error("the secret is in the job log")
	}
	tfruntest.AssertNoProcesses(t, 30*time.Second, work)
}

// probe applies a local-exec provisioner running script in the sandbox (under content id
// contentID), which writes its findings into files of its work dir, and returns the job, the
// work dir and read, which returns such a file's trimmed content.
func probe(t *testing.T, e *tfrun.Engine, contentID, script string) (*tfrun.Job, string, func(name string) string) {
	t.Helper()
	j := apply(t, e, contentID, fmt.Sprintf(`
resource "terraform_data" "probe" {
  provisioner "local-exec" {
    command = %q
  }
}`, script))
	if j.Status != tfrun.StatusSucceeded {
		t.Fatalf("probe: %s %v\n%s", j.Status, j.Err(), strings.Join(j.Log, "\n"))
	}
	work := tfruntest.WorkDir(e, contentID)
	return j, work, func(name string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(work, name))
		if err != nil {
			t.Fatalf("probe result %s: %v", name, err)
		}
		return strings.TrimSpace(string(b))
	}
}

// check is a shell line that writes yes or no into file name, as cmd succeeded.
func check(name, cmd string) string {
	return fmt.Sprintf(`if %s >/dev/null 2>&1; then echo yes; else echo no; fi > %s`, cmd, name)
}

// TestVariablesFileOnlyForSandboxUser: the variables (credentials among them) are 0600 and owned
// by the sandbox user, who can read them; the content files and work dir are that user's too.
func TestVariablesFileOnlyForSandboxUser(t *testing.T) {
	t.Parallel()
	e := tfruntest.NewEngine(t, tfrun.Options{})
	j, err := e.Submit(t.Context(), tfrun.Request{Op: tfrun.OpApply, ContentID: "vars",
		Files: map[string][]byte{"main.tf": []byte(`
variable "token" {
  type      = string
  sensitive = true
}
resource "terraform_data" "x" { input = sha256(var.token) }
output "h" { value = terraform_data.x.output }`)},
		Variables: map[string]any{"token": "s3cret-token"}})
	if err != nil {
		t.Fatal(err)
	}
	if j = tfruntest.Wait(t, e, j.ID, jobTimeout); j.Status != tfrun.StatusSucceeded {
		t.Fatalf("apply: %s %v", j.Status, j.Err())
	}
	vars := filepath.Join(e.Options().Dir, "stacks", "vars", "variables.json")
	fi, err := os.Stat(vars)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 || fileUID(fi) != 65534 {
		t.Errorf("variables file: mode %v uid %d, want 0600 uid 65534", fi.Mode().Perm(), fileUID(fi))
	}
	for _, p := range []string{tfruntest.WorkDir(e, "vars"), filepath.Join(tfruntest.WorkDir(e, "vars"), "main.tf")} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fileUID(fi) != 65534 || fi.Mode().Perm()&0o077 != 0 {
			t.Errorf("%s: mode %v uid %d, want the sandbox user's only", p, fi.Mode().Perm(), fileUID(fi))
		}
	}
}

// TestSandboxSeesMinimalEtc: the sandbox's /etc is its own, not the host's: passwd and group name
// root, nobody/nogroup and no host account; shadow, ssh's keys, machine-id and the host's other
// files are absent; the CA bundle is the host's, readable by the sandbox user; hosts resolves
// localhost.
func TestSandboxSeesMinimalEtc(t *testing.T) {
	t.Parallel()
	for _, p := range []string{"/etc/shadow", "/etc/ssl/certs/ca-certificates.crt"} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("the host has no %s: the test proves nothing here (%v)", p, err)
		}
	}
	e := tfruntest.NewEngine(t, tfrun.Options{})
	script := strings.Join([]string{
		`ls -A /etc > etc-list`,
		`cat /etc/passwd > passwd`,
		`cat /etc/group > group`,
		`cp /etc/ssl/certs/ca-certificates.crt ca.crt`,
		`id -un > user`,
		`getent hosts localhost > localhost`,
		check("shadow", "test -e /etc/shadow"),
		check("ssh", "test -e /etc/ssh"),
		check("machine-id", "test -e /etc/machine-id"),
		check("ssl-private", "test -e /etc/ssl/private"),
		check("write-etc", "touch /etc/passwd"),
	}, "\n")
	_, _, read := probe(t, e, "etc", script)
	allowed := map[string]bool{"passwd": true, "group": true, "hosts": true, "resolv.conf": true,
		"nsswitch.conf": true, "localtime": true, "ssl": true, "pki": true, "ld.so.cache": true, "alternatives": true}
	list := strings.Fields(read("etc-list"))
	for _, name := range list {
		if !allowed[name] {
			t.Errorf("/etc/%s is in the sandbox", name)
		}
	}
	for _, name := range []string{"passwd", "group", "hosts", "nsswitch.conf", "ssl"} {
		if !slices.Contains(list, name) {
			t.Errorf("/etc/%s is missing from the sandbox (has %v)", name, list)
		}
	}
	var users []string
	for _, line := range strings.Split(read("passwd"), "\n") {
		users = append(users, strings.SplitN(line, ":", 2)[0])
	}
	if fmt.Sprint(users) != "[root nobody]" {
		t.Errorf("passwd accounts %v, want [root nobody]", users)
	}
	if got := read("user"); got != "nobody" {
		t.Errorf("the sandbox user is %q, want nobody", got)
	}
	var groups []string
	for _, line := range strings.Split(read("group"), "\n") {
		groups = append(groups, strings.SplitN(line, ":", 2)[0])
	}
	if fmt.Sprint(groups) != "[root nogroup]" {
		t.Errorf("groups %v, want [root nogroup]", groups)
	}
	host, err := os.ReadFile("/etc/ssl/certs/ca-certificates.crt")
	if err != nil {
		t.Fatal(err)
	}
	if got := read("ca.crt"); got != strings.TrimSpace(string(host)) {
		t.Errorf("the sandbox's CA bundle (%d bytes) is not the host's (%d bytes)", len(got), len(host))
	}
	if got := read("localhost"); !strings.Contains(got, "127.0.0.1") && !strings.Contains(got, "::1") {
		t.Errorf("localhost resolves to %q", got)
	}
	for _, name := range []string{"shadow", "ssh", "machine-id", "ssl-private", "write-etc"} {
		if got := read(name); got != "no" {
			t.Errorf("%s: %s, want no", name, got)
		}
	}
}

// TestSandboxEtcNamesItsOwnUser: with another uid and gid (terraformer --sandbox-uid/gid), the
// sandbox's passwd and group name them kloud-sandbox beside root and nobody/nogroup, so that
// `id -un` and whatever looks the user up find it.
func TestSandboxEtcNamesItsOwnUser(t *testing.T) {
	t.Parallel()
	e := tfruntest.NewEngine(t, tfrun.Options{SandboxUID: 64001, SandboxGID: 64002})
	_, _, read := probe(t, e, "etc-uid", strings.Join([]string{
		`id -un > user`,
		`id -gn > group`,
		`cut -d: -f1,3,4,6 /etc/passwd | tr '\n' ' ' > passwd`,
		`cut -d: -f1,3 /etc/group | tr '\n' ' ' > groups`,
	}, "\n"))
	if got := read("user") + " " + read("group"); got != "kloud-sandbox kloud-sandbox" {
		t.Errorf("id -un, id -gn: %q, want kloud-sandbox kloud-sandbox", got)
	}
	if got := read("passwd"); got != "root:0:0:/root nobody:65534:65534:/nonexistent kloud-sandbox:64001:64002:/tmp" {
		t.Errorf("passwd: %q", got)
	}
	if got := read("groups"); got != "root:0 nogroup:65534 kloud-sandbox:64002" {
		t.Errorf("group: %q", got)
	}
}
