package kloud_test

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kloud"
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

	t.Run("results", func(t *testing.T) { checkRouteTypes(t, e) })
}

// checkRouteTypes: every route has the descriptor of package api (api.Descriptors) whose params
// and result types it was made with, and every descriptor a route; and every method of the
// typed client, called on a real connection, sends a route's params type and decodes its
// result into that route's result type (what the server's handler returns). A method routed
// without a descriptor in the table, or a client method that decodes another type than the
// handler answers, fails here.
func checkRouteTypes(t *testing.T, e *kloudtest.Env) {
	routes := map[string]kloud.Route{}
	for _, r := range e.Server.Routes() {
		routes[r.Method] = r
	}
	ds := api.Descriptors()
	for m, r := range routes {
		d, ok := ds[m]
		switch {
		case !ok:
			t.Errorf("%s: routed, but no descriptor in api.Descriptors", m)
		case r.Result == nil:
			t.Errorf("%s: the route records no result type", m)
		case d.ParamsType() != r.Params || d.ResultType() != r.Result:
			t.Errorf("%s: the route takes %v and answers %v; its descriptor says %v and %v", m, r.Params, r.Result, d.ParamsType(), d.ResultType())
		}
	}
	for m := range ds {
		if _, ok := routes[m]; !ok {
			t.Errorf("%s: a descriptor in api.Descriptors, but not routed", m)
		}
	}

	// The client's methods, each called once with zero params as a member (most are refused:
	// invalid params, or for owners only; nothing changes): the call made is what counts.
	rec := &recorder{Caller: e.Dial("alice")}
	cl := api.NewClient(rec)
	called := map[string]bool{}
	ct := reflect.TypeFor[*api.Client]()
	for i := range ct.NumMethod() {
		meth := ct.Method(i)
		switch meth.Name {
		case "Conn":
			continue
		case "JobWatch": // needs the *kite.Conn itself (a stream); its descriptor is checked above
			called[api.MethodJobWatch] = true
			continue
		case "EventWatch": // a stream, as JobWatch
			called[api.MethodEventWatch] = true
			continue
		}
		args := []reflect.Value{reflect.ValueOf(cl), reflect.ValueOf(t.Context())}
		if meth.Type.NumIn() == 3 {
			args = append(args, reflect.Zero(meth.Type.In(2)))
		}
		*rec = recorder{Caller: rec.Caller}
		meth.Func.Call(args)
		r, ok := routes[rec.method]
		switch {
		case rec.method == "":
			t.Errorf("Client.%s made no call", meth.Name)
		case !ok:
			t.Errorf("Client.%s calls %s, which kloud does not route", meth.Name, rec.method)
		case rec.params != r.Params:
			t.Errorf("Client.%s sends %s params of type %v; the route binds %v", meth.Name, rec.method, rec.params, r.Params)
		case rec.result != r.Result:
			t.Errorf("Client.%s decodes %s's result into %v; the handler answers %v", meth.Name, rec.method, rec.result, r.Result)
		case meth.Type.Out(0) != r.Result:
			t.Errorf("Client.%s returns %v; %s answers %v", meth.Name, meth.Type.Out(0), rec.method, r.Result)
		}
		called[rec.method] = true
	}
	for m := range routes {
		if !called[m] && m != api.MethodPluginRegister && m != api.MethodReplicaAgentCall && m != api.MethodReplicaPluginCall { // plugins call it (provider/plugin), replicas the others (mesh.go)
			t.Errorf("%s: routed, but no method of api.Client calls it", m)
		}
	}
}

// recorder is a connection that notes the last call's method, params type and result type.
type recorder struct {
	api.Caller
	method         string
	params, result reflect.Type
}

func (r *recorder) Call(ctx context.Context, method string, params, result any) error {
	r.method, r.params, r.result = method, reflect.TypeOf(params), reflect.TypeOf(result).Elem()
	return r.Caller.Call(ctx, method, params, result)
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
