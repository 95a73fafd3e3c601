package kloud_test

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
)

// TestMethodTable: every method kloud's kite serves (but the kite built-ins) is a constant of
// package api (kloud's own in api.KloudMethods, kontrol's in api.KontrolMethods), every kloud
// route has a params type of package api, and docs/protocol.md documents exactly the methods
// served: nothing served undocumented, nothing documented unserved.
func TestMethodTable(t *testing.T) {
	t.Parallel()
	e := kloudtest.Start(t, kloudtest.Options{})

	var served []string
	for _, m := range e.Server.Kite.Methods() {
		if !strings.HasPrefix(m, "kite.") {
			served = append(served, m)
		}
	}
	sort.Strings(served)
	want := append(api.KloudMethods(), api.KontrolMethods()...)
	sort.Strings(want)
	if !slices.Equal(served, want) {
		t.Errorf("served methods and api's lists differ:\nserved: %v\napi:    %v", served, want)
	}
	if !slices.IsSorted(api.KloudMethods()) || !slices.IsSorted(api.KontrolMethods()) {
		t.Errorf("api.KloudMethods and api.KontrolMethods must be sorted")
	}

	apiPkg := reflect.TypeFor[api.Client]().PkgPath()
	seen := map[string]bool{}
	for _, r := range e.Server.Routes() {
		if seen[r.Method] {
			t.Errorf("%s: twice in the route table", r.Method)
		}
		seen[r.Method] = true
		if !slices.Contains(api.KloudMethods(), r.Method) {
			t.Errorf("%s: routed but not in api.KloudMethods", r.Method)
		}
		if r.Params == nil || r.Params.PkgPath() != apiPkg {
			t.Errorf("%s: params type %v is not a type of package api", r.Method, r.Params)
		}
		if r.Who == "" {
			t.Errorf("%s: no authorization in the route table", r.Method)
		}
	}
	for _, m := range api.KloudMethods() {
		if !seen[m] {
			t.Errorf("%s: in api.KloudMethods but not in the route table", m)
		}
	}

	documented := protocolMethods(t)
	if !slices.Equal(documented, want) {
		t.Errorf("docs/protocol.md and the served methods differ:\nundocumented: %v\nnot served:   %v",
			minus(want, documented), minus(documented, want))
	}
}

// protocolMethods returns the methods documented in the method tables of docs/protocol.md's
// kontrol and kloud sections: the first cell of each row, where "`stack.describe` / `list`"
// names stack.describe and stack.list.
func protocolMethods(t *testing.T) []string {
	root, err := testutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "docs", "protocol.md"))
	if err != nil {
		t.Fatal(err)
	}
	name := regexp.MustCompile("^`([a-zA-Z.]+)`$")
	var out []string
	in := false
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "## ") {
			in = line == "## kontrol" || strings.HasPrefix(line, "## kloud")
			continue
		}
		if !in || !strings.HasPrefix(line, "| `") {
			continue
		}
		cell := strings.TrimSpace(strings.Split(line, "|")[1])
		ns := ""
		for _, part := range strings.Split(cell, "/") {
			m := name.FindStringSubmatch(strings.TrimSpace(part))
			if m == nil {
				t.Fatalf("docs/protocol.md: cannot read the method cell %q", cell)
			}
			n := m[1]
			if i := strings.LastIndex(n, "."); i >= 0 {
				ns = n[:i]
			} else {
				n = ns + "." + n
			}
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return slices.Compact(out)
}

func minus(a, b []string) []string {
	var out []string
	for _, x := range a {
		if !slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	return out
}
