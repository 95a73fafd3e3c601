package kloud_test

import (
	"testing"

	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/providers/dummy"
)

// TestMachinesNameTheirStack: machine.list and machine.info name a machine's stack by its title
// (the template's, by default), which the UI shows instead of the stack's id.
func TestMachinesNameTheirStack(t *testing.T) {
	t.Parallel()
	f := newFlow(t, dummy.Options{})
	f.credential()
	sid, ms := f.stack(f.template(twoVMs))
	res, err := f.client().MachineList(t.Context(), api.MachineListParams{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Machines) != 2 || len(res.StackTitles) != 1 || res.StackTitles[sid] != "two vms" {
		t.Fatalf("machine.list: %d machines, stackTitles %v; want their stack %s titled %q", len(res.Machines), res.StackTitles, sid, "two vms")
	}
	info, err := f.client().MachineInfo(t.Context(), api.MachineRef{MachineID: ms[0].ID})
	if err != nil {
		t.Fatal(err)
	}
	if info.StackTitle != "two vms" {
		t.Fatalf("machine.info: stackTitle %q, want %q", info.StackTitle, "two vms")
	}
}
