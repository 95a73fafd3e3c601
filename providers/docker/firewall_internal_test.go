package docker

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/provider"
)

// The firewall trusts the containers' kloud_owner and kloud_team labels: a stack's token binds
// them, so a create through the proxy cannot claim another owner or team.
func TestCreateBindsOwnerLabels(t *testing.T) {
	t.Parallel()
	d, err := New(Options{Host: "unix:///nonexistent.sock", Image: "kloud/machine:t", Instance: "i1", StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	s, err := d.stackToken(&provider.BaseStack{StackID: "s1", Team: "red",
		Machines: []*provider.MachineSpec{{ID: "m1", Owner: "alice"}, {ID: "m2", Owner: "bob"}}})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := d.parseToken(s)
	if err != nil {
		t.Fatal(err)
	}
	body := func(machine, owner, team string) []byte {
		b, _ := json.Marshal(map[string]any{
			"Image": "kloud/machine:t", "Entrypoint": []string{BootPath},
			"Labels":     map[string]string{LabelStack: "s1", LabelMachine: machine, LabelInstance: "i1", LabelOwner: owner, LabelTeam: team},
			"HostConfig": map[string]any{"NetworkMode": DefaultNetwork},
		})
		return b
	}
	for _, ok := range [][3]string{{"m1", "alice", "red"}, {"m2", "bob", "red"}} {
		if err := d.createAllowed(tok, body(ok[0], ok[1], ok[2]), "kloud/machine:t"); err != nil {
			t.Errorf("%v: %v", ok, err)
		}
	}
	for _, bad := range [][3]string{{"m2", "alice", "red"}, {"m1", "bob", "red"}, {"m1", "alice", "blue"}, {"m1", "", "red"}, {"m1", "alice", ""}} {
		err := d.createAllowed(tok, body(bad[0], bad[1], bad[2]), "kloud/machine:t")
		if err == nil || !strings.Contains(err.Error(), "owner") {
			t.Errorf("%v: got %v, want a refusal naming the owner", bad, err)
		}
	}
}

// Rules files are named by kloud machine id: no id leaves the firewall directory.
func TestFirewallPath(t *testing.T) {
	t.Parallel()
	d, err := New(Options{Host: "unix:///nonexistent.sock", Image: "i", StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", ".", "..", "../x", "a/b", ".hidden", strings.Repeat("a", 65), "a\x00"} {
		if p, err := d.fwPath(bad); err == nil {
			t.Errorf("machine id %q: path %s", bad, p)
		}
	}
	if p, err := d.fwPath("m-1.x_2"); err != nil || !strings.HasSuffix(p, "/firewall/m-1.x_2.json") {
		t.Errorf("a good id: %s %v", p, err)
	}
}
