package plugin_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/provider"
)

// filesInventory lists the files provider's machines (files in dir named stack.machine) as
// resources tagged for instance "i1", and removes them.
type filesInventory struct{ dir string }

func (i filesInventory) Resources(context.Context) ([]provider.Resource, error) {
	ents, err := os.ReadDir(i.dir)
	if err != nil {
		return nil, err
	}
	var out []provider.Resource
	for _, e := range ents {
		var stack, machine string
		if _, err := fmt.Sscanf(e.Name(), "%2s.%2s", &stack, &machine); err != nil {
			continue
		}
		fi, _ := e.Info()
		out = append(out, provider.Resource{ID: e.Name(), Kind: "file", CreatedAt: fi.ModTime().UTC().Truncate(time.Second),
			Tags: provider.ResourceTags(stack, "t", "alice", machine, "i1")})
	}
	return out, nil
}

func (i filesInventory) RemoveResource(_ context.Context, r provider.Resource) error {
	if r.Tag(provider.TagInstance) != "i1" {
		return errors.New("not this instance's")
	}
	err := os.Remove(filepath.Join(i.dir, filepath.Base(r.ID)))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// TestResources: a plugin whose Provider has an Inventory advertises "resources"; kloud's proxy
// lists its resources (tags, times) and removes one through the plugin; a plugin without one
// does not advertise it and its proxy has no Inventory.
func TestResources(t *testing.T) {
	e := startKloud(t)
	dir := t.TempDir()
	for _, n := range []string{"s1.m1", "s1.m2", "s2.m3"} {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("Running"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	p := filesProvider("files", newSeen("a"), noUnavailable())
	p.Inventory = filesInventory{dir}
	e.run(p, e.pluginKey("files"))
	e.run(filesProvider("plain", newSeen("b"), noUnavailable()), e.pluginKey("plain"))
	e.wait("files")
	e.wait("plain")

	px, err := e.reg.Lookup("files")
	if err != nil {
		t.Fatal(err)
	}
	if !px.Can(provider.CapResources) || px.Inventory == nil {
		t.Fatalf("proxy of a plugin with an Inventory: capabilities %v, inventory %v", px.Caps(), px.Inventory)
	}
	rs, err := px.Inventory.Resources(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range rs {
		ids = append(ids, r.ID)
		if r.Tag(provider.TagOwner) != "alice" || r.Tag(provider.TagInstance) != "i1" || r.CreatedAt.IsZero() || r.Kind != "file" {
			t.Errorf("resource %+v: tags or time lost on the wire", r)
		}
	}
	if !slices.Equal(ids, []string{"s1.m1", "s1.m2", "s2.m3"}) {
		t.Fatalf("resources %v", ids)
	}
	if err := px.Inventory.RemoveResource(t.Context(), rs[1]); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "s1.m2")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("s1.m2 after RemoveResource: %v", err)
	}
	other := rs[0]
	other.Tags = provider.ResourceTags("s1", "t", "alice", "m1", "i2")
	if err := px.Inventory.RemoveResource(t.Context(), other); err == nil || err.Error() != "not this instance's" {
		t.Errorf("RemoveResource refused by the plugin: %v, want its reason", err)
	}
	if err := px.Inventory.RemoveResource(t.Context(), provider.Resource{}); err == nil {
		t.Error("RemoveResource of an empty resource: no error")
	}

	plain, err := e.reg.Lookup("plain")
	if err != nil {
		t.Fatal(err)
	}
	if plain.Can(provider.CapResources) || plain.Inventory != nil {
		t.Errorf("proxy of a plugin without an Inventory: capabilities %v", plain.Caps())
	}
}
