package kloudtest

import (
	"context"
	"net/http/httptest"
	"path/filepath"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/terraformer"
	"github.com/kloud-dev/kloud/terraformer/tfrun"
	"github.com/kloud-dev/kloud/terraformer/tfrun/tfruntest"
)

// StartTerraformer runs a real terraformer (real terraform, offline mirror) that trusts this
// kloud's keys, connects kloud to it with kloud's own kite key, and returns the client.
func (e *Env) StartTerraformer() *terraformer.Client {
	e.t.Helper()
	return e.StartTerraformerWith(tfrun.Options{})
}

// StartTerraformerWith is StartTerraformer with the engine's options (e.g. TerraformPath and
// CLIConfigFile for a provider's own Terraform provider mirror); tfruntest.NewEngine fills the
// rest.
func (e *Env) StartTerraformerWith(o tfrun.Options) *terraformer.Client {
	t := e.t
	t.Helper()
	engine := tfruntest.NewEngine(t, o)
	k, err := kite.New(kite.Options{
		Identity:      kite.Identity{Name: terraformer.Name},
		Authenticator: terraformer.NewAuthenticator(terraformer.AuthOptions{KloudURL: e.URL}),
		Logger:        testutil.Logger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := terraformer.New(terraformer.Options{Engine: engine, Kite: k, Logger: testutil.Logger(t)}); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(terraformer.Handler(k, engine))
	key, err := kitekey.ReadFile(filepath.Join(e.dataDir, kloud.KloudKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	ck, err := kite.New(kite.Options{Identity: kite.Identity{Name: "kloud", Username: "kloud"}, Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	c := terraformer.NewClient(ck, srv.URL+"/kite", func(context.Context) (kite.Auth, error) {
		return kite.Auth{Type: kite.AuthKiteKey, Key: key}, nil
	})
	t.Cleanup(func() {
		c.Close()
		ck.Close()
		k.Close()
		srv.Close()
	})
	e.Server.SetTerraformer(c)
	return c
}
