package kite_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"

	"github.com/kloud-dev/kloud/kite"
)

// A server kite with one typed method, and a client kite calling it over a loopback WebSocket.
func Example() {
	// The serving side: who may connect (here a toy check of "user:<name>" keys; kloud uses
	// kitekey's JWT verification) and what it offers.
	auth := kite.AuthenticatorFunc(func(_ context.Context, _ kite.Identity, a kite.Auth) (*kite.Principal, error) {
		name, ok := strings.CutPrefix(a.Key, "user:")
		if !ok {
			return nil, fmt.Errorf("unknown key: %w", kite.ErrAuth)
		}
		return &kite.Principal{Username: name, Type: a.Type}, nil
	})
	server, err := kite.New(kite.Options{Identity: kite.Identity{Name: "greeter"}, Authenticator: auth})
	if err != nil {
		panic(err)
	}
	defer server.Close()
	type greetParams struct {
		Greeting string `json:"greeting"`
	}
	server.Handle("greeter.greet", kite.Typed(func(_ context.Context, r *kite.Request, p *greetParams) (any, error) {
		return p.Greeting + ", " + r.Principal().Username, nil
	}))
	hs := httptest.NewServer(server) // a Kite is an http.Handler: GET /kite upgraded to WebSocket
	defer hs.Close()

	// The dialing side: its own kite (it may serve calls from the server too).
	client, err := kite.New(kite.Options{Identity: kite.Identity{Name: "cli", Username: "alice"}})
	if err != nil {
		panic(err)
	}
	defer client.Close()
	conn, err := client.Dial(context.Background(), hs.URL+"/kite", kite.Auth{Type: kite.AuthKiteKey, Key: "user:alice"})
	if err != nil {
		panic(err)
	}
	defer conn.Close(nil)

	var reply string
	if err := conn.Call(context.Background(), "greeter.greet", greetParams{Greeting: "hello"}, &reply); err != nil {
		panic(err)
	}
	fmt.Println(reply)
	fmt.Println(conn.Peer().Name)

	// Errors come back as the sentinels of errors.go.
	err = conn.Call(context.Background(), "greeter.shout", nil, nil)
	fmt.Println(errors.Is(err, kite.ErrMethodNotFound))
	// Output:
	// hello, alice
	// greeter
	// true
}
