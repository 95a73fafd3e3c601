package e2e

// TestKloudBinaryLinks checks what the kloud binary links: the binaries the tests run are built
// with the Makefile's tags (testutil.BuildTags), the binary built so has none of FerretDB's
// PostgreSQL backend (the embedded store uses SQLite), and no package of this module in it imports
// a test helper (testing, net/http/httptest, a ...test package of ours).

import (
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
)

func TestKloudBinaryLinks(t *testing.T) {
	root, err := testutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^TAGS := (.*)$`).FindSubmatch(mk)
	if m == nil || string(m[1]) != testutil.BuildTags {
		t.Fatalf("Makefile's TAGS is %q, testutil.BuildTags %q: they must agree", m, testutil.BuildTags)
	}

	// The binary TestMain built, as the Makefile builds it.
	out, err := exec.Command("go", "version", "-m", filepath.Join(bin, "kloud")).CombinedOutput()
	if err != nil {
		t.Fatalf("go version -m: %v\n%s", err, out)
	}
	info := string(out)
	if !strings.Contains(info, "-tags="+testutil.BuildTags) {
		t.Errorf("bin/kloud was not built with -tags=%s:\n%s", testutil.BuildTags, info)
	}
	for _, mod := range []string{"github.com/jackc/pgx", "github.com/FerretDB/FerretDB"} {
		has := strings.Contains(info, "\tdep\t"+mod)
		if want := mod == "github.com/FerretDB/FerretDB"; has != want {
			t.Errorf("bin/kloud links %s: %v, want %v", mod, has, want)
		}
	}

	// No package of ours in the binary imports a test helper.
	cmd := exec.Command("go", "list", "-tags", testutil.BuildTags, "-deps",
		"-f", `{{if .Module}}{{if .Module.Main}}{{.ImportPath}} {{join .Imports " "}}{{end}}{{end}}`, "./cmd/kloud")
	cmd.Dir = root
	list, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	ours := 0
	for _, l := range strings.Split(strings.TrimSpace(string(list)), "\n") {
		f := strings.Fields(l)
		ours++
		for _, imp := range f[1:] {
			if imp == "testing" || imp == "net/http/httptest" ||
				(strings.HasPrefix(imp, "github.com/kloud-dev/kloud/") && strings.Contains(path.Base(imp), "test")) {
				t.Errorf("%s, linked into kloud, imports the test helper %s", f[0], imp)
			}
		}
	}
	if ours < 20 {
		t.Fatalf("go list found only %d packages of this module in kloud", ours)
	}
}
