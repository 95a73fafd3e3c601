package bridgefw

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables"

	"github.com/kloud-dev/kloud/internal/testutil"
)

// Change is idempotent both ways; Save and Load round-trip; a tampered or oversized file is
// refused.
func TestChangeSaveLoad(t *testing.T) {
	a, b := Rule{Port: 80, From: "any"}, Rule{Port: 53, Protocol: "udp", From: "team"}
	got, err := Change(nil, []Rule{a, b, a}, true)
	if err != nil || len(got) != 2 {
		t.Fatalf("open: %+v %v", got, err)
	}
	got2, _ := Change(got, []Rule{{Port: 80, Protocol: "TCP", From: "any"}, {Port: 9, From: "any"}}, false)
	if len(got2) != 1 || got2[0] != (Rule{Port: 53, Protocol: "udp", From: "team"}) || len(got) != 2 {
		t.Fatalf("close: %+v (have %+v)", got2, got)
	}
	if _, err := Change(got, []Rule{{Port: 0, From: "any"}}, true); err == nil {
		t.Error("a bad rule changed the rules")
	}
	path := filepath.Join(t.TempDir(), "m.json")
	if rules, err := Load(path); err != nil || rules != nil {
		t.Fatalf("missing file: %+v %v", rules, err)
	}
	if err := Save(path, got); err != nil {
		t.Fatal(err)
	}
	if back, err := Load(path); err != nil || !slices.Equal(back, got) {
		t.Fatalf("load: %+v %v", back, err)
	}
	os.WriteFile(path, []byte(`{"rules":[{"port":99999,"protocol":"tcp","from":"any"}]}`), 0o600)
	if _, err := Load(path); err == nil {
		t.Error("a file with a bad rule loaded")
	}
	if err := Save(path, make([]Rule, MaxRules+1)); err == nil || !strings.Contains(err.Error(), "at most") {
		t.Errorf("oversized: %v", err)
	}
}

// Update: load, change and save in one, making the directory (0700); a bad rule or a tampered
// file changes nothing.
func TestUpdate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "firewall", "m.json")
	a, b := Rule{Port: 80, From: "any"}, Rule{Port: 53, Protocol: "udp", From: "team"}
	got, err := Update(path, []Rule{a, b}, true)
	if err != nil || len(got) != 2 {
		t.Fatalf("open: %+v %v", got, err)
	}
	if fi, err := os.Stat(filepath.Dir(path)); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("the rules directory: %v %v", fi, err)
	}
	if got, err := Update(path, []Rule{{Port: 80, Protocol: "tcp", From: "any"}}, false); err != nil || len(got) != 1 || got[0] != b {
		t.Fatalf("close: %+v %v", got, err)
	}
	if _, err := Update(path, []Rule{{Port: 0, From: "any"}}, true); err == nil {
		t.Error("a bad rule was saved")
	}
	if back, err := Load(path); err != nil || !slices.Equal(back, []Rule{b}) {
		t.Fatalf("after a refused update: %+v %v", back, err)
	}
	os.WriteFile(path, []byte(`{"rules":[{"port":99999,"protocol":"tcp","from":"any"}]}`), 0o600)
	if _, err := Update(path, []Rule{a}, true); err == nil {
		t.Error("a tampered file was updated")
	}
}

// The chain: one anti-spoofing rule per machine; the owner's other machines by port; a team
// rule only for machines of the team; drops per machine and for the subnet.
func TestChain(t *testing.T) {
	ms := []Machine{
		{ID: "a", Port: "va", IP: netip.MustParseAddr("10.9.0.2"), Group: "owner:alice", Team: "red",
			Rules: []Rule{{Port: 80, Protocol: "tcp", From: "team"}, {Port: 81, Protocol: "tcp", From: "10.9.0.0/24"}, {Port: 82, Protocol: "tcp", From: "any"}, {Port: 83, Protocol: "tcp", From: "kloud"}}},
		{ID: "b", Port: "vb", IP: netip.MustParseAddr("10.9.0.3"), Group: "owner:alice", Team: "red"},
		{ID: "c", Port: "vc", IP: netip.MustParseAddr("10.9.0.4"), Group: "owner:bob", Team: "red"},
		{ID: "d", Port: "vd", IP: netip.MustParseAddr("10.9.0.5"), Group: "owner:carol", Team: "blue"},
	}
	got := len(chain(netip.MustParsePrefix("10.9.0.0/24"), ms))
	// 4 anti-spoof + 2 owner (a<-b, b<-a) + team for a (b, c) 2 + cidr 1 + any 1 + 3 drops × 4
	// machines + 3 subnet drops.
	if want := 4 + 2 + 2 + 1 + 1 + 12 + 3; got != want {
		t.Errorf("chain has %d rules, want %d", got, want)
	}
}

// Apply and Remove on the real kernel: the table is there, then gone; Remove of a missing table
// is no error.
func TestApplyRemove(t *testing.T) {
	if err := Usable(); err != nil {
		testutil.Unavailable(t, "nftables: %v", err)
	}
	tb := NewTable(fmt.Sprintf("kfwt%d", os.Getpid()), netip.MustParsePrefix("10.9.0.0/24"))
	t.Cleanup(func() { tb.Remove(context.Background()) })
	ms := []Machine{{ID: "a", Port: "va", IP: netip.MustParseAddr("10.9.0.2"), Group: "g"}, {ID: "x", Port: "", IP: netip.MustParseAddr("10.9.0.9")}}
	for range 2 {
		if err := tb.Apply(t.Context(), ms); err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := tb.Exists(); err != nil || !ok {
		t.Fatalf("after Apply: exists %v %v", ok, err)
	}
	for range 2 {
		if err := tb.Remove(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := tb.Exists(); err != nil || ok {
		t.Fatalf("after Remove: exists %v %v", ok, err)
	}
}

// RemoveOrphans removes the table of a bridge that is gone when its subnet overlaps the one
// asked about, and leaves the others: another subnet's, and a table whose bridge exists.
func TestRemoveOrphans(t *testing.T) {
	if err := Usable(); err != nil {
		testutil.Unavailable(t, "nftables: %v", err)
	}
	ms := []Machine{{ID: "a", Port: "va", IP: netip.MustParseAddr("10.9.201.2"), Group: "g"}}
	gone := NewTable(fmt.Sprintf("kfwo%d", os.Getpid()), netip.MustParsePrefix("10.9.201.0/24"))
	other := NewTable(fmt.Sprintf("kfwp%d", os.Getpid()), netip.MustParsePrefix("10.9.202.0/24"))
	live := NewTable("lo", netip.MustParsePrefix("10.9.201.0/24")) // lo always exists
	for _, tb := range []*Table{gone, other, live} {
		t.Cleanup(func() { tb.replace(nil) })
		if err := tb.replace(func(c *nftables.Conn, nt *nftables.Table) {
			c.AddTable(nt)
			accept := nftables.ChainPolicyAccept
			ch := c.AddChain(&nftables.Chain{Name: "forward", Table: nt, Type: nftables.ChainTypeFilter,
				Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})
			for _, rule := range chain(tb.Subnet, ms) {
				c.AddRule(&nftables.Rule{Table: nt, Chain: ch, Exprs: rule})
			}
		}); err != nil {
			t.Fatal(err)
		}
	}
	removed, err := RemoveOrphans(t.Context(), netip.MustParsePrefix("10.9.201.128/25"))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(removed, []string{gone.Name}) {
		t.Errorf("removed %v, want [%s]", removed, gone.Name)
	}
	for tb, want := range map[*Table]bool{gone: false, other: true, live: true} {
		if ok, err := tb.Exists(); err != nil || ok != want {
			t.Errorf("table %s exists %v (%v), want %v", tb.Name, ok, err, want)
		}
	}
}
