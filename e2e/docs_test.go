package e2e

// TestDocsLinks reads README.md and docs/*.md as a newcomer with only this repository would: every
// relative Markdown link, and every `path/in/repo` code span (one whose first segment is a
// top-level entry of the module, such as `kloud/routes.go` or `docs/protocol.md`), must name a file
// or directory that exists inside the repository; a link or span that climbs out of it (`../x`)
// fails. TestDocsLayout checks the README's layout table against the tree: every top-level
// directory and every provider under providers/ and examples/ is named there.

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/provider/tmpl"
)

var (
	// mdLink is an inline Markdown link or image: [text](target) or [text](target "title").
	mdLink = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	// codeSpan is a single-backtick code span.
	codeSpan = regexp.MustCompile("`([^`\n]+)`")
	// pathLike is a code span that may be a path: no spaces, only path characters.
	pathLike = regexp.MustCompile(`^[A-Za-z0-9_.\-/+]+$`)
	// pathPlaceholder is a path segment that stands for a value (ID, NAME).
	pathPlaceholder = regexp.MustCompile(`^[A-Z_]+$`)
)

// notPaths are code spans of the documents that look like repository paths and name something
// else.
var notPaths = map[string]string{
	"kloud/kloudlocal":         "a Terraform provider source",
	"kloud/kloudvagrant":       "a Terraform provider source",
	"kloud/mycloud":            "a Terraform provider source (the tutorial's)",
	"kontrol/keys.json":        "a file of the data directory",
	"kontrol/revocations.json": "a file of the data directory",
}

// docFiles returns README.md and docs/*.md, relative to root.
func docFiles(t *testing.T, root string) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files := []string{"README.md"}
	for _, d := range docs {
		files = append(files, filepath.Join("docs", filepath.Base(d)))
	}
	if len(files) < 5 {
		t.Fatalf("docs: found only %v", files)
	}
	return files
}

// topLevel returns the module's top-level entries that documents may name as paths: what the
// repository holds, less the build output and dot-entries.
func topLevel(t *testing.T, root string) map[string]bool {
	t.Helper()
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	top := map[string]bool{}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") || e.Name() == "bin" {
			continue
		}
		top[e.Name()] = true
	}
	return top
}

// docRefs returns the repository paths a document refers to, each with where it stands, and the
// references that point outside the repository. Fenced blocks are commands, not references, and
// are skipped.
func docRefs(file, text string, top map[string]bool) (refs map[string]string, outside []string) {
	refs = map[string]string{}
	fence := false
	for n, line := range strings.Split(text, "\n") {
		at := file + ":" + strconv.Itoa(n+1)
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fence = !fence
			continue
		}
		if fence {
			continue
		}
		for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") || strings.HasPrefix(target, "#") {
				continue
			}
			target, _, _ = strings.Cut(target, "#")
			p := filepath.Join(filepath.Dir(file), target)
			if strings.HasPrefix(p, "..") {
				outside = append(outside, at+": link "+m[1])
				continue
			}
			refs[p] = at
		}
		for _, m := range codeSpan.FindAllStringSubmatch(line, -1) {
			span := m[1]
			if strings.HasPrefix(span, "../") {
				outside = append(outside, at+": "+span)
				continue
			}
			if !pathLike.MatchString(span) || !strings.Contains(span, "/") {
				continue
			}
			first, _, _ := strings.Cut(span, "/")
			if !top[first] || notPaths[span] != "" {
				continue
			}
			p := strings.TrimSuffix(strings.TrimSuffix(span, "/..."), "/")
			if strings.Contains(p, "...") || pathPlaceholder.MatchString(filepath.Base(p)) {
				continue // a pattern (kloud/kp-...) or a placeholder (kite/ID)
			}
			refs[filepath.Clean(p)] = at
		}
	}
	return refs, outside
}

func TestDocsLinks(t *testing.T) {
	root, err := testutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	top := topLevel(t, root)
	checked := 0
	for _, file := range docFiles(t, root) {
		b, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			t.Fatal(err)
		}
		refs, outside := docRefs(file, string(b), top)
		for _, o := range outside {
			t.Errorf("%s points outside the repository: state what it needs here instead", o)
		}
		for p, at := range refs {
			checked++
			if _, err := os.Stat(filepath.Join(root, p)); err != nil {
				t.Errorf("%s: %s does not exist in the repository", at, p)
			}
		}
	}
	// The documents name well over a hundred paths: a parser that finds few is broken.
	if checked < 100 {
		t.Fatalf("checked only %d references", checked)
	}
}

func TestDocsLayout(t *testing.T) {
	root, err := testutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, layout, ok := strings.Cut(string(b), "\n## Layout\n")
	if !ok {
		t.Fatal("README.md has no ## Layout section")
	}
	layout, _, _ = strings.Cut(layout, "\n## ")
	rows := map[string]string{} // first column → the row
	for _, l := range strings.Split(layout, "\n") {
		cols := strings.Split(l, "|")
		if len(cols) < 3 {
			continue
		}
		rows[strings.Trim(strings.TrimSpace(cols[1]), "`")] = l
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") || e.Name() == "bin" {
			continue
		}
		if _, ok := rows[e.Name()+"/"]; !ok {
			t.Errorf("README.md's layout table has no row for %s/", e.Name())
		}
	}
	for _, parent := range []string{"providers", "examples"} {
		subs, err := os.ReadDir(filepath.Join(root, parent))
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range subs {
			if s.IsDir() && !strings.Contains(rows[parent+"/"], "`"+s.Name()+"`") &&
				!strings.Contains(rows[parent+"/"], "`"+parent+"/"+s.Name()+"`") {
				t.Errorf("README.md's layout row for %s/ does not name %s", parent, s.Name())
			}
		}
	}
}

// TestDocsReadmeParams reads the README's template of parameters as kloud does (provider/tmpl),
// and checks what its commands say: the preset's values apply, and cpus=9 is refused with the
// message the README prints.
func TestDocsReadmeParams(t *testing.T) {
	blocks := fencedBlocks(t, "README.md", "hcl")
	if len(blocks) != 1 {
		t.Fatalf("README.md has %d hcl blocks, want one: the template of parameters", len(blocks))
	}
	cfg, err := tmpl.Parse(map[string][]byte{"main.tf": []byte(blocks[0].text)})
	if err != nil {
		t.Fatal(err)
	}
	ps, err := cfg.Params(nil)
	if err != nil {
		t.Fatal(err)
	}
	big := "big"
	vals, err := ps.Resolve(tmpl.Input{Strings: map[string]string{"cpus": "2"}, Preset: &big})
	if err != nil || vals["size"] != "large" || vals["cpus"] != "2" {
		t.Errorf("--preset big --param cpus=2: %v %v", vals, err)
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, err = ps.Resolve(tmpl.Input{Strings: map[string]string{"cpus": "9"}})
	if err == nil || !strings.Contains(string(readme), "refused: "+err.Error()) {
		t.Errorf("--param cpus=9: %v, which the README does not print", err)
	}
}
