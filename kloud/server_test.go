package kloud_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
)

func TestAdminKeySurvivesRestartAndAgentsCannotCallKloud(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	e := kloudtest.Start(t, kloudtest.Options{DataDir: dir})
	key, err := kitekey.ReadFile(filepath.Join(dir, kloud.AdminKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	c := e.DialAuth(kite.Auth{Type: kite.AuthKiteKey, Key: key})
	kloudtest.Call(t, c, "job.list", nil, nil)
	addr := e.Addr
	e.Stop()

	// Same data dir, same address: the admin key from the first start still works (the signing
	// keys live in the store).
	e2 := kloudtest.Start(t, kloudtest.Options{DataDir: dir, Addr: addr})
	c2 := e2.DialAuth(kite.Auth{Type: kite.AuthKiteKey, Key: key})
	kloudtest.Call(t, c2, "job.list", nil, nil)

	agentKey, _, err := e2.Server.Kontrol.CreateKey("alice", kloud.AgentKitePrefix+"m1")
	if err != nil {
		t.Fatal(err)
	}
	agent := e2.DialAuth(kite.Auth{Type: kite.AuthKiteKey, Key: agentKey})
	if err := agent.Call(t.Context(), "job.list", nil, nil); !errors.Is(err, kite.ErrPermission) {
		t.Fatalf("an agent's key called a kloud method: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, kloud.KloudKeyFile)); err != nil {
		t.Fatal(err)
	}
}
