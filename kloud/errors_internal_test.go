package kloud

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/store"
)

func TestWireErrorMapsStoreSentinels(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err  error
		kite *kite.Error
	}{
		{store.ErrNotFound, kite.ErrNotFound},
		{store.ErrConflict, kite.ErrConflict},
		{store.ErrLocked, kite.ErrConflict},
		{store.ErrLeaseLost, kite.ErrConflict},
		{store.ErrState, kite.ErrState},
	} {
		wrapped := fmt.Errorf("stack s1: %w", c.err)
		got := wireError(wrapped)
		if !errors.Is(got, c.kite) || !errors.Is(got, c.err) {
			t.Errorf("%v: mapped error matches kite %v: %t, store sentinel: %t", c.err, c.kite, errors.Is(got, c.kite), errors.Is(got, c.err))
		}
		if got.Error() != wrapped.Error() {
			t.Errorf("%v: message %q, want %q", c.err, got.Error(), wrapped.Error())
		}
		if w := kite.ToWire(got); w.Code != c.kite.Code {
			t.Errorf("%v: wire code %d, want %d", c.err, w.Code, c.kite.Code)
		}
		if w := kite.ToWire(wrapped); w.Code == c.kite.Code {
			t.Errorf("%v: the store error alone already has code %d: the store depends on kite again?", c.err, w.Code)
		}
	}
	// A handler's own kite code wins over the store condition it wraps.
	own := fmt.Errorf("%w: %w", kite.ErrPermission, store.ErrNotFound)
	if got := wireError(own); kite.ToWire(got).Code != kite.ErrPermission.Code {
		t.Errorf("a kite-coded error was remapped: %v", got)
	}
	// Other errors pass unchanged.
	for _, err := range []error{nil, errors.New("disk full"), store.ErrClosed, store.ErrJobCancelled} {
		if got := wireError(err); got != err {
			t.Errorf("wireError(%v) = %v, want it unchanged", err, got)
		}
	}
}

// TestEveryStoreSentinelIsDecided lists the store's exported Err* variables: each is either
// mapped to a kite code or deliberately left an internal error, so a new sentinel cannot reach
// clients as an internal error by oversight.
func TestEveryStoreSentinelIsDecided(t *testing.T) {
	t.Parallel()
	internal := map[string]bool{"ErrClosed": true, "ErrJobCancelled": true}
	mapped := map[error]bool{}
	for _, m := range storeCodes {
		mapped[m.store] = true
	}
	byName := map[string]error{
		"ErrNotFound": store.ErrNotFound, "ErrConflict": store.ErrConflict, "ErrLocked": store.ErrLocked,
		"ErrLeaseLost": store.ErrLeaseLost, "ErrState": store.ErrState, "ErrClosed": store.ErrClosed,
		"ErrJobCancelled": store.ErrJobCancelled, "ErrUnavailable": store.ErrUnavailable,
	}
	files, err := filepath.Glob(filepath.Join("store", "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("store sources: %v %v", files, err)
	}
	fset := token.NewFileSet()
	var found int
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range af.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.VAR {
				continue
			}
			for _, sp := range g.Specs {
				for _, n := range sp.(*ast.ValueSpec).Names {
					if !n.IsExported() || !strings.HasPrefix(n.Name, "Err") {
						continue
					}
					found++
					e, known := byName[n.Name]
					switch {
					case !known:
						t.Errorf("store.%s is new: map it in storeCodes (errors.go) or list it as internal here", n.Name)
					case internal[n.Name] == mapped[e]:
						t.Errorf("store.%s: mapped %t, internal %t: decide one", n.Name, mapped[e], internal[n.Name])
					}
				}
			}
		}
	}
	if found < len(byName) {
		t.Errorf("found %d store sentinels, want at least %d", found, len(byName))
	}
}
