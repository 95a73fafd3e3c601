package store_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// moduleRoot is the directory of go.mod above the working directory.
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the working directory")
		}
		dir = parent
	}
}

// TestOnlyTheStoreTouchesTheDatabase parses every non-test Go file of the module (but bench/):
// outside kloud/store
// (and its subpackages, such as storetest) no file imports the MongoDB driver, builds a bson.M
// or calls a Collection method, so every document access goes through the typed repositories;
// and neither kloud/store's nor kloud/model's non-test files import kite or kloud/api (the
// store's errors are its own; kloud maps them to kite codes in kloud/errors.go).
func TestOnlyTheStoreTouchesTheDatabase(t *testing.T) {
	root := moduleRoot(t)
	const mongoDriver = "go.mongodb.org/mongo-driver"
	const kitePkg = "github.com/kloud-dev/kloud/kite"
	fset := token.NewFileSet()
	var files int
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if name := d.Name(); rel != "." && (strings.HasPrefix(name, ".") || name == "testdata" || name == "vendor" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		inStore := strings.HasPrefix(rel, "kloud/store/")
		if strings.HasSuffix(path, "_test.go") || strings.HasPrefix(rel, "bench/") {
			// Tests may simulate old records (storetest.SetFields is the preferred way), and the
			// bench programs may seed and time the database directly.
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		files++
		bsonNames := map[string]bool{}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			switch {
			case (inStore || strings.HasPrefix(rel, "kloud/model/")) && (p == kitePkg || strings.HasPrefix(p, kitePkg+"/") || p == "github.com/kloud-dev/kloud/kloud/api"):
				t.Errorf("%s imports %s: kloud/store and kloud/model do not depend on the transport", rel, p)
			case !inStore && strings.HasPrefix(p, mongoDriver):
				t.Errorf("%s imports %s: only kloud/store talks to the database (use its repositories)", rel, p)
			}
			if strings.HasPrefix(p, mongoDriver) && strings.HasSuffix(p, "/bson") {
				name := "bson"
				if imp.Name != nil {
					name = imp.Name.Name
				}
				bsonNames[name] = true
			}
		}
		if inStore {
			return nil
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.SelectorExpr:
				if id, ok := n.X.(*ast.Ident); ok && bsonNames[id.Name] && n.Sel.Name == "M" {
					t.Errorf("%s: bson.M outside kloud/store", fset.Position(n.Pos()))
				}
			case *ast.CallExpr:
				if sel, ok := n.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "Collection" {
					t.Errorf("%s: a Collection call outside kloud/store (use a repository, or storetest.SetFields/Raw in a test that simulates an old record)", fset.Position(n.Pos()))
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 50 {
		t.Fatalf("parsed only %d files under %s: is this the module root?", files, root)
	}
}
