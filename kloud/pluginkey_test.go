package kloud_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
)

// pluginCallable is all a provider plugin may call on kloud's kite: register itself (the route
// provider/plugin's Host serves, once kloud routes it) and the public built-ins. Adding a method
// here is a security decision.
var pluginCallable = []string{
	"plugin.register",
	"kite.ping", "kite.handshake", // public
}

// TestPluginKeyRefusedByEveryKloudMethod is generated from the methods kloud's kite serves
// (kloud's, kontrol's and kite's built-ins): a plugin key — presented as what it is, as a kite
// key and as a session — gets -32002 naming what plugin keys are for from every method a plugin
// may not call.
func TestPluginKeyRefusedByEveryKloudMethod(t *testing.T) {
	t.Parallel()
	e := kloudtest.Start(t, kloudtest.Options{})
	methods := e.Server.Kite.Methods()
	if len(methods) < 30 {
		t.Fatalf("kloud serves only %d methods: %v", len(methods), methods)
	}
	key, id, err := e.Server.Kontrol.CreatePluginKey(kitekey.PluginKeySpec{Provider: "example"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(id, kitekey.PluginIDPrefix) {
		t.Fatalf("plugin key id %q", id)
	}
	for _, typ := range []string{kitekey.KindPluginKey, kite.AuthKiteKey, kite.AuthSession} {
		c := e.DialAuth(kite.Auth{Type: typ, Key: key})
		n := 0
		for _, m := range methods {
			if slices.Contains(pluginCallable, m) {
				continue
			}
			n++
			err := c.Call(t.Context(), m, nil, nil)
			var ke *kite.Error
			if !errors.As(err, &ke) || ke.Code != kite.CodePermission || !strings.Contains(err.Error(), "plugin keys may only call the plugin-facing methods") {
				t.Errorf("%s (auth %s): %v, want -32002 plugin keys may only call the plugin-facing methods", m, typ, err)
			}
		}
		t.Logf("auth %s: %d methods refused", typ, n)
		var pong string
		if err := c.Call(t.Context(), "kite.ping", nil, &pong); err != nil || pong != "pong" {
			t.Errorf("kite.ping: %q %v", pong, err)
		}
	}
}
