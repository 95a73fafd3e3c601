package cli_test

import (
	"encoding/json"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kontrol/kontrolapi"
)

// TestKitesAndKeyCreate: `kloud key create` (kontrol.createKey) writes a kite key whose kite id
// it reports; a kite dialing with it and registering shows in `kloud kites` with that id and
// user, and `kloud kites --json` keeps its shape (kite, url, registeredAt for each).
func TestKitesAndKeyCreate(t *testing.T) {
	e, run, must := startKloud(t, kloudtest.Options{})
	must(run("user", "add", "alice", "--team", model.DefaultTeam))
	path := filepath.Join(t.TempDir(), "alice.key")
	var created struct {
		Path, KiteID, Username string
	}
	if err := json.Unmarshal([]byte(must(run("key", "create", "--username", "alice", "--out", path, "--json"))), &created); err != nil {
		t.Fatal(err)
	}
	if created.Path != path || created.Username != "alice" || created.KiteID == "" {
		t.Fatalf("key create --json: %+v", created)
	}
	key, err := kitekey.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	k, err := kite.New(kite.Options{Identity: kite.Identity{Name: "cli-test"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	conn, err := k.Dial(t.Context(), e.URL+"/kite", kite.Auth{Type: kite.AuthKiteKey, Key: key})
	if err != nil {
		t.Fatal(err)
	}
	kloudtest.Call(t, conn, kontrolapi.MethodRegister, kontrolapi.RegisterParams{}, nil)

	var kites []map[string]json.RawMessage
	if err := json.Unmarshal([]byte(must(run("kites", "--username", "alice", "--name", "cli-test", "--json"))), &kites); err != nil {
		t.Fatal(err)
	}
	if len(kites) != 1 {
		t.Fatalf("kites --json: %d kites of alice named cli-test, want 1: %v", len(kites), kites)
	}
	if got := slices.Sorted(maps.Keys(kites[0])); !slices.Equal(got, []string{"kite", "registeredAt", "url"}) {
		t.Errorf("kites --json: keys %v, want kite, registeredAt, url", got)
	}
	var id kite.Identity
	if err := json.Unmarshal(kites[0]["kite"], &id); err != nil || id.ID != created.KiteID || id.Username != "alice" {
		t.Errorf("kites --json: kite %s (%v), want id %s of alice", kites[0]["kite"], err, created.KiteID)
	}
	if out := must(run("kites", "--name", "cli-test")); !strings.Contains(out, created.KiteID) || !strings.Contains(out, "alice") {
		t.Errorf("kites: no line for %s of alice:\n%s", created.KiteID, out)
	}
	if out := must(run("kites", "--name", "no-such-kite", "--json")); strings.TrimSpace(out) != "[]" && strings.TrimSpace(out) != "null" {
		t.Errorf("kites --json of none: %q", out)
	}
	if code, _, stderr := run("kites", "--name", "a/b"); code == 0 || !strings.Contains(stderr, "contains '/'") {
		t.Errorf("kites --name a/b: exit %d, %q", code, stderr)
	}
}
