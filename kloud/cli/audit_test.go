package cli_test

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store"
)

// TestAuditFromTheCLI: `kloud audit` shows the calls that changed something as a table (and
// --json), filters by user, action, target and since, refuses members and bad flags; `kloud
// audit verify` says ok, run twice; after an entry is edited in the store it names that entry
// and exits 1.
func TestAuditFromTheCLI(t *testing.T) {
	t.Parallel()
	e, run, must := startKloud(t, kloudtest.Options{})
	aliceKey := filepath.Join(t.TempDir(), "alice.key")
	alice := func(args ...string) (int, string, string) { return run(append(args, "--key", aliceKey)...) }
	must(run("user", "add", "alice", "--team", model.DefaultTeam))
	must(run("key", "create", "--username", "alice", "--out", aliceKey))
	must(alice("team", "create", "red"))
	must(run("quota", "set", "--user", "alice", "--machines", "3"))
	must(alice("team", "list")) // read-only: not in the log

	out := must(run("audit"))
	t.Logf("kloud audit:\n%s", out)
	for _, w := range []string{"SEQ", "ACTION", "user.add", "user/alice", "team.create", "team/red", "quota.set", "ok"} {
		if !strings.Contains(out, w) {
			t.Errorf("kloud audit: no %q in\n%s", w, out)
		}
	}
	if strings.Contains(out, "team.list") {
		t.Errorf("kloud audit shows a read-only call:\n%s", out)
	}
	var res api.AuditListResult
	if err := json.Unmarshal([]byte(must(run("audit", "--user", "alice", "--json"))), &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Entries) != 1 || res.Entries[0].Action != "team.create" || res.Entries[0].User != "alice" || res.Entries[0].Hash == "" {
		t.Fatalf("kloud audit --user alice --json: %+v", res)
	}
	if out := must(run("audit", "--target", "red", "--since", "1h")); !strings.Contains(out, "team.create") || strings.Contains(out, "quota.set") {
		t.Errorf("--target red --since 1h:\n%s", out)
	}
	if out := must(run("audit", "--action", "quota.set", "--since", "2000-01-01")); !strings.Contains(out, "user/alice") || strings.Contains(out, "team.create") {
		t.Errorf("--action quota.set:\n%s", out)
	}
	if code, _, stderr := run("audit", "--since", "yesterday"); code == 0 || !strings.Contains(stderr, "--since") {
		t.Errorf("--since yesterday: exit %d, %s", code, stderr)
	}
	if code, _, stderr := alice("audit"); code == 0 || !strings.Contains(stderr, "administrators") {
		t.Errorf("kloud audit by a member: exit %d, %s", code, stderr)
	}

	for range 2 {
		if out := must(run("audit", "verify")); !strings.HasPrefix(out, "ok: ") {
			t.Fatalf("kloud audit verify: %s", out)
		}
	}
	coll := e.Server.Store().Collection(store.CollAudit)
	if _, err := coll.UpdateOne(t.Context(), bson.M{"_id": int64(2)}, bson.M{"$set": bson.M{"user": "mallory"}}); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := run("audit", "verify")
	if code == 0 || !strings.Contains(stderr, "entry 2") {
		t.Fatalf("verify after an edit: exit %d\n%s%s", code, stdout, stderr)
	}
	code, stdout, _ = run("audit", "verify", "--json")
	var v api.AuditVerifyResult
	if err := json.Unmarshal([]byte(stdout), &v); err != nil || code == 0 || v.OK || v.BadSeq != 2 {
		t.Fatalf("verify --json after an edit: exit %d %+v %v", code, v, err)
	}
}
