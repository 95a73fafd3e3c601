package atomicfile_test

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"github.com/kloud-dev/kloud/internal/atomicfile"
)

// entries lists dir's names (temporary files included).
func entries(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// TestWriteFile: a new file and a replaced one (even read-only) get the content and exactly the
// mode asked for, whatever the umask; nothing else is left in the directory.
func TestWriteFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "key")
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	for i, perm := range []os.FileMode{0o400, 0o644, 0o600} {
		want := fmt.Appendf(nil, "content %d\n", i)
		if err := atomicfile.WriteFile(p, want, perm); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(p)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("content %q %v, want %q", got, err, want)
		}
		if st, _ := os.Stat(p); st.Mode().Perm() != perm {
			t.Fatalf("mode %v, want %v", st.Mode().Perm(), perm)
		}
		if e := entries(t, dir); len(e) != 1 {
			t.Fatalf("left in the directory: %v", e)
		}
	}
	if err := atomicfile.WriteFile(filepath.Join(dir, "missing", "f"), nil, 0o600); err == nil {
		t.Fatal("a write into a missing directory succeeded")
	}
}

// TestSymlinkReplaced: a symlink planted at the target is replaced, its target never written.
func TestSymlinkReplaced(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "state.json")
	if err := os.Symlink(victim, p); err != nil {
		t.Fatal(err)
	}
	if err := atomicfile.WriteFile(p, []byte("new"), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "keep" {
		t.Fatalf("the symlink's target was written: %q", b)
	}
	if st, err := os.Lstat(p); err != nil || !st.Mode().IsRegular() {
		t.Fatalf("target after the write: %v %v", st, err)
	}
}

// TestCreate: a streamed replacement is invisible until Commit; one not committed (Cleanup)
// leaves the old file and no temporary file; a failed Commit (the target is a directory) leaves
// no temporary file; Commit twice is an error.
func TestCreate(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "snap.tar.zst")
	if err := os.WriteFile(p, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := atomicfile.Create(p, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte("half"))
	if b, _ := os.ReadFile(p); string(b) != "old" {
		t.Fatalf("visible before Commit: %q", b)
	}
	f.Cleanup()
	if b, _ := os.ReadFile(p); string(b) != "old" {
		t.Fatalf("after Cleanup: %q", b)
	}
	if e := entries(t, dir); len(e) != 1 {
		t.Fatalf("left after Cleanup: %v", e)
	}

	f, err = atomicfile.Create(p, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Cleanup()
	f.Write([]byte("new"))
	if err := f.Commit(); err != nil {
		t.Fatal(err)
	}
	f.Cleanup() // after Commit: nothing
	if b, _ := os.ReadFile(p); string(b) != "new" {
		t.Fatalf("after Commit: %q", b)
	}
	if err := f.Commit(); err == nil {
		t.Fatal("a second Commit succeeded")
	}

	sub := filepath.Join(dir, "sub")
	if err := os.MkdirAll(filepath.Join(sub, "full"), 0o700); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(sub, "full", "x"), nil, 0o600)
	if err := atomicfile.WriteFile(filepath.Join(sub, "full"), []byte("x"), 0o600); err == nil {
		t.Fatal("replacing a non-empty directory succeeded")
	}
	if e := entries(t, sub); len(e) != 1 {
		t.Fatalf("left after a failed Commit: %v", e)
	}
}

// TestRemoveTemps removes what interrupted replacements of one file left, not other files' nor
// the file itself; a missing directory is no error.
func TestRemoveTemps(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "a")
	for _, n := range []string{"a", ".a.tmp-123", ".a.tmp-456", ".ab.tmp-1", "a.tmp-1", ".b.tmp-1"} {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	f, err := atomicfile.Create(p, 0o600) // an interrupted one of this process, too
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := atomicfile.RemoveTemps(p); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(entries(t, dir)); got != "[.ab.tmp-1 .b.tmp-1 a a.tmp-1]" {
		t.Fatalf("left: %s", got)
	}
	if err := atomicfile.RemoveTemps(filepath.Join(dir, "missing", "x")); err != nil {
		t.Fatal(err)
	}
}

// TestConcurrent: writers racing on one file each leave a whole content, never a mix, and no
// temporary file.
func TestConcurrent(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			if err := atomicfile.WriteFile(p, bytes.Repeat([]byte{byte('a' + i)}, 1<<16), 0o600); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	b, _ := os.ReadFile(p)
	if len(b) != 1<<16 || !bytes.Equal(b, bytes.Repeat(b[:1], 1<<16)) {
		t.Fatalf("mixed content (%d bytes)", len(b))
	}
	if e := entries(t, dir); len(e) != 1 {
		t.Fatalf("left: %v", e)
	}
}

// TestKilledMidWrite: a process killed (SIGKILL) while it writes the replacement leaves the old
// content in place and its temporary file beside, which RemoveTemps removes.
func TestKilledMidWrite(t *testing.T) {
	if p := os.Getenv("ATOMICFILE_TEST_CHILD"); p != "" {
		f, err := atomicfile.Create(p, 0o600)
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		f.Write(bytes.Repeat([]byte("new "), 1<<18))
		fmt.Println("writing")
		select {} // killed here, before Commit
	}
	dir := t.TempDir()
	p := filepath.Join(dir, "state.json")
	if err := atomicfile.WriteFile(p, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestKilledMidWrite$")
	cmd.Env = append(os.Environ(), "ATOMICFILE_TEST_CHILD="+p)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	kill := func() {
		if !killed {
			killed = true
			cmd.Process.Kill()
			cmd.Wait()
		}
	}
	defer kill()
	line, _ := bufio.NewReader(out).ReadString('\n')
	if line != "writing\n" {
		t.Fatalf("child: %q", line)
	}
	kill()
	if b, _ := os.ReadFile(p); string(b) != "old" {
		t.Fatalf("after the kill: %.20q", b)
	}
	if e := entries(t, dir); len(e) != 2 {
		t.Fatalf("want the file and the killed write's temporary file: %v", e)
	}
	if err := atomicfile.RemoveTemps(p); err != nil {
		t.Fatal(err)
	}
	if e := entries(t, dir); len(e) != 1 {
		t.Fatalf("left after RemoveTemps: %v", e)
	}
}
