package e2e

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
)

// TestBrowserParams (issue 22 §2): a template's typed parameters as a new user meets them in
// the web UI, with kloud serve, the real Chromium and a dummy machine (a real klient): the New
// stack page shows a labelled input per parameter filled by the default preset, shows a value
// the validation refuses next to its field with the variable's own message, and creates and
// builds the stack, whose page then changes a mutable parameter (stack.update) but not an
// immutable one; terraform got the values typed (the machine's attributes), and the sensitive
// value is in no answer of kloud's. Screenshots in $KLOUD_ARTIFACTS/TestBrowserParams.
func TestBrowserParams(t *testing.T) {
	node, script, out := browserPrereqs(t)
	e := newEnv(t)
	password := browserUsers(t, e)
	e.key = ""
	e.run("key", "create", "--username", "alice", "--out", e.dir+"/alice.key")
	e.key = e.dir + "/alice.key"
	e.run("credential", "add", "--provider", "dummy", "--title", "mine", "--field", "token=abc123")
	tid := e.template(testutil.ModuleFile(t, "provider/tmpl/testdata/params.tf"))

	runBrowserScript(t, e, node, script, out, "params.mjs", nil, "KLOUD_PASSWORD="+password, "KLOUD_TEMPLATE_ID="+tid)

	var stacks []struct {
		ID, State, Preset string
		JobID             string
		Variables         map[string]string
	}
	e.runJSON(&stacks, "stack", "list")
	if len(stacks) != 1 {
		t.Fatalf("stacks: %+v", stacks)
	}
	st := stacks[0]
	t.Cleanup(func() { e.try("stack", "destroy", st.ID) })
	if st.State != "Initialized" || st.Preset != "big" || st.Variables["size"] != "large" || st.Variables["cpus"] != "2" || st.Variables["tags"] != `["a","b"]` {
		t.Fatalf("stack: %+v", st)
	}
	job := e.run("job", "get", st.JobID, "--json")
	var view struct {
		MachineDocs []struct {
			Attributes struct {
				TriggersReplace json.RawMessage `json:"triggers_replace"`
			}
		}
	}
	e.runJSON(&view, "stack", "describe", st.ID)
	var tr bytes.Buffer
	if len(view.MachineDocs) != 1 || json.Compact(&tr, view.MachineDocs[0].Attributes.TriggersReplace) != nil || tr.String() != `{"cpus":2,"size":"large","tags":["a","b"]}` {
		t.Errorf("terraform did not get the typed values: the machine's triggers_replace is %s", tr.String())
	}
	for _, answer := range []string{job, e.run("stack", "list", "--json"), e.run("stack", "describe", st.ID, "--json")} {
		if strings.Contains(answer, "k3y-value") {
			t.Fatalf("kloud shows the sensitive value:\n%s", answer)
		}
	}
}
