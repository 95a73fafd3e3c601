package layersnap_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/layersnap"
	"github.com/kloud-dev/kloud/internal/testutil"
)

const (
	envKillUpper = "LAYERSNAP_TEST_UPPER"
	envKillSnap  = "LAYERSNAP_TEST_SNAPSHOT"
)

// TestMain runs a Restore in a child process when asked (TestRestoreKilled kills it).
func TestMain(m *testing.M) {
	if upper := os.Getenv(envKillUpper); upper != "" {
		f, err := os.Open(os.Getenv(envKillSnap))
		if err == nil {
			err = layersnap.Restore(context.Background(), f, upper, layersnap.RestoreOptions{KeepPaths: []string{"etc/machine-id"}})
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// A Restore killed (SIGKILL) at any point leaves the old layer or the new one, never a mix; the
// next Restore removes what it left beside the upper dir.
func TestRestoreKilled(t *testing.T) {
	testutil.RequireRoot(t)
	dir := t.TempDir()
	mk := func(name, content string, n int) string {
		p := filepath.Join(dir, name)
		for i := range n {
			d := filepath.Join(p, fmt.Sprintf("d%02d", i%40))
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("f%04d", i)), bytes.Repeat([]byte(content), 100+i), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		os.MkdirAll(filepath.Join(p, "etc"), 0o755)
		os.WriteFile(filepath.Join(p, "etc/machine-id"), []byte("target"), 0o444)
		return p
	}
	oldTree, newTree := mk("old", "o", 300), mk("new", "n", 600)
	skip := []string{"etc/machine-id"} // kept: its time is the restore's
	wantOld, wantNew := tree(t, oldTree, skip...), tree(t, newTree, skip...)
	snapOld, snapNew := filepath.Join(dir, "old.tar.zst"), filepath.Join(dir, "new.tar.zst")
	for p, src := range map[string]string{snapOld: oldTree, snapNew: newTree} {
		if err := os.WriteFile(p, save(t, src, nil).Bytes(), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	upper := filepath.Join(dir, "machine", "upper")
	os.MkdirAll(filepath.Dir(upper), 0o755)
	if err := os.Rename(oldTree, upper); err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	var full time.Duration // how long a whole restore in a child takes: the kills fall in 0-120% of it
	for i := range 6 {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), envKillUpper+"="+upper, envKillSnap+"="+snapNew)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		t0 := time.Now()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if i > 0 {
			time.Sleep(time.Duration(rand.Int64N(int64(full) * 12 / 10)))
			cmd.Process.Kill()
		}
		err := cmd.Wait()
		if i == 0 {
			if full = time.Since(t0); err != nil {
				t.Fatalf("a restore in a child: %v: %s", err, stderr.String())
			}
			t.Logf("a whole restore in a child: %s", full)
		}
		if b, err := os.ReadFile(filepath.Join(upper, "etc/machine-id")); err != nil || string(b) != "target" {
			t.Fatalf("round %d: the kept machine-id: %q %v", i, b, err)
		}
		switch got := tree(t, upper, skip...); got {
		case wantOld:
			seen["old"]++
		case wantNew:
			seen["new"]++
			// Back to the old layer for the next round (this Restore also removes leftovers).
			f, _ := os.Open(snapOld)
			if err := layersnap.Restore(t.Context(), f, upper, layersnap.RestoreOptions{KeepPaths: []string{"etc/machine-id"}}); err != nil {
				t.Fatal(err)
			}
			f.Close()
		default:
			t.Fatalf("round %d (child: %v %s): the upper dir is neither the old layer nor the new one", i, err, stderr.String())
		}
	}
	t.Logf("after the kills: %v", seen)
	if err := layersnap.RemoveLeftovers(upper); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(filepath.Dir(upper)); len(ents) != 1 {
		t.Fatalf("beside the upper dir: %v", ents)
	}
}
