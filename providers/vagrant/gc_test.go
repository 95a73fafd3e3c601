package vagrant

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/klient/klientapi"
	"github.com/kloud-dev/kloud/kontrol/kontroltest"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/vagrant/vagranttest"
)

// The inventory (kloud gc) lists, on the real host, what a crash left half-made and the machines
// of this instance with kloud's tags, and removes them but not another instance's.
func TestInventory(t *testing.T) {
	ko := kontroltest.Start(t, kontroltest.Options{})
	keyFile, _ := ko.KeyFile("alice")
	host := vagranttest.Start(t, ko.URL(), keyFile)
	v, err := New(Options{StateDir: t.TempDir(), Hosts: KontrolHosts(ko.Kontrol), Instance: "k1", Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	h, err := v.hosts.Host(ctx, "alice", "")
	if err != nil {
		t.Fatal(err)
	}
	mk := func(name, stack string, complete bool, instance string) {
		if err := v.call(ctx, h, klientapi.MethodVagrantCreate, klientapi.VagrantCreateParams{Token: h.Token, Name: name, Image: vagranttest.Image}, nil); err != nil {
			t.Fatal(err)
		}
		if err := v.writeRecord(&record{Name: name, Host: h.KiteID, Owner: "alice", Instance: instance, Hostname: name, Image: vagranttest.Image,
			Tags: map[string]string{TagStack: stack, TagMachine: "m-" + name}, Complete: complete}); err != nil {
			t.Fatal(err)
		}
	}
	mk("half", "s1", false, "k1") // a crash mid-create
	mk("kept", "s1", true, "k1")  // a live stack's
	mk("dead", "s2", true, "k1")  // a stack kloud no longer has
	mk("other", "s2", true, "k2") // another kloud's
	mk("busy", "s1", false, "k1") // being created right now
	v.setInflight("busy", true)

	// The inventory (capability resources, kloud gc) lists this instance's records but the one
	// being created, with kloud's tags; it removes only this instance's.
	rs, err := inventory{v}.Resources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]provider.Resource{}
	for _, r := range rs {
		listed[r.ID] = r
	}
	if len(rs) != 3 || !listed["half"].Incomplete || listed["kept"].Incomplete || listed["kept"].Tag(provider.TagOwner) != "alice" ||
		listed["dead"].Tag(provider.TagStack) != "s2" || listed["kept"].Tag(provider.TagInstance) != "k1" || listed["kept"].CreatedAt.IsZero() {
		t.Errorf("Resources: %+v, want half (incomplete), kept and dead with kloud's tags", rs)
	}
	foreign := provider.Resource{ID: "other", Kind: KindMachine, Tags: provider.ResourceTags("s2", "", "alice", "m-other", "k1")}
	if err := (inventory{v}).RemoveResource(ctx, foreign); err == nil {
		t.Error("RemoveResource of another instance's machine: no error")
	}

	// kloud's gc removes what it judges garbage (here: half, not in any state, and dead, whose
	// stack is gone); the half-made one is listed without a creation time, so no grace period
	// keeps what a crash left (nothing of this process is making it).
	if !listed["half"].CreatedAt.IsZero() {
		t.Errorf("the half-made machine is listed created at %v, want none (no grace)", listed["half"].CreatedAt)
	}
	for _, id := range []string{"dead", "half"} {
		if err := (inventory{v}).RemoveResource(ctx, listed[id]); err != nil {
			t.Errorf("RemoveResource(%s): %v", id, err)
		}
	}
	for name, want := range map[string]bool{"half": false, "dead": false, "kept": true, "other": true, "busy": true} {
		_, derr := os.Stat(filepath.Join(host.Home, "machines", name))
		_, rerr := v.readRecord(name)
		if (derr == nil) != want || (rerr == nil) != want {
			t.Errorf("%s: on the host %v, recorded %v; want kept = %v", name, derr, rerr, want)
		}
	}
	// Leave nothing: the test's own cleanup of the rest.
	v.setInflight("busy", false)
	rs, err = inventory{v}.Resources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if err := (inventory{v}).RemoveResource(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if err := v.call(ctx, h, klientapi.MethodVagrantDestroy, klientapi.VagrantNameParams{Token: h.Token, Name: "other"}, nil); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(filepath.Join(host.Home, "machines")); len(ents) != 0 {
		t.Errorf("left on the host: %v", ents)
	}
}
