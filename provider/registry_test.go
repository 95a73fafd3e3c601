package provider_test

import (
	"testing"

	"github.com/kloud-dev/kloud/provider"
)

func TestRegistryReplace(t *testing.T) {
	r := provider.NewRegistry()
	a := &provider.Provider{Name: "p", ResourceType: "p_machine"}
	r.Replace(a) // registers a new name
	if got, err := r.Lookup("p"); err != nil || got != a || got.UserDataAttr != "user_data" {
		t.Fatalf("lookup after Replace: %+v %v", got, err)
	}
	b := &provider.Provider{Name: "p", ResourceType: "p2_machine", NoCloudInit: true}
	r.Replace(b)
	if got, _ := r.Lookup("p"); got != b || got.UserDataAttr != "" {
		t.Fatalf("Replace kept %+v", got)
	}
	if r.ByResourceType("p_machine") != nil || r.ByResourceType("p2_machine") != b {
		t.Fatal("ByResourceType still finds the replaced provider")
	}
	if n := r.Names(); len(n) != 1 || n[0] != "p" {
		t.Fatalf("names %v", n)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("Register of a taken name did not panic")
			}
		}()
		r.Register(&provider.Provider{Name: "p"})
	}()
	func() {
		defer func() {
			if recover() == nil {
				t.Error("Replace of an unnamed provider did not panic")
			}
		}()
		r.Replace(&provider.Provider{})
	}()
}
