package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/klient/webterm"
	"github.com/kloud-dev/kloud/kontrol"
)

// direct is a diagnostic side: a kontrol in this process that a second klient registers with,
// and an attach endpoint here, so this process is the browser on klient's own WebSocket — the
// terminal without kloud's relay in between. The difference to "kloud→klient" is what the
// relay costs.
type direct struct {
	url    string
	ko     *kontrol.Kontrol
	kiteID string
	mu     sync.Mutex
	legs   map[string]chan *websocket.Conn
}

// startDirect starts the kontrol and writes a kite key for the bench owner's second klient.
func startDirect(dir string) (*direct, string, error) {
	discard := slog.New(slog.NewTextHandler(io.Discard, nil))
	kr, err := kitekey.LoadOrCreateFileKeyring(filepath.Join(dir, "keys.json"))
	if err != nil {
		return nil, "", err
	}
	revs, err := kontrol.OpenFileRevocations(filepath.Join(dir, "revocations.json"))
	if err != nil {
		return nil, "", err
	}
	k, err := kite.New(kite.Options{Identity: kite.Identity{Name: "kontrol", Username: "kontrol"}, Logger: discard,
		Authenticator: &kitekey.Authenticator{Verifier: &kitekey.Verifier{Keys: kr.Keyring, Issuer: "kontrol", Revoked: revs}}})
	if err != nil {
		return nil, "", err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", err
	}
	d := &direct{url: "http://" + ln.Addr().String(), legs: map[string]chan *websocket.Conn{}}
	d.ko, err = kontrol.New(kontrol.Options{Kite: k, Keyring: kr.Keyring, Revocations: revs, URL: d.url + "/kite", Logger: discard})
	if err != nil {
		return nil, "", err
	}
	mux := http.NewServeMux()
	mux.Handle("/kite", k)
	mux.HandleFunc(webterm.AttachPath, d.attach)
	go http.Serve(ln, mux)
	key, id, err := d.ko.CreateKey(owner, "")
	if err != nil {
		return nil, "", err
	}
	d.kiteID = id
	path := filepath.Join(dir, "direct.key")
	return d, path, kitekey.WriteFile(path, key)
}

func (d *direct) attach(w http.ResponseWriter, r *http.Request) {
	t := r.URL.Query().Get("ticket")
	d.mu.Lock()
	ch := d.legs[t]
	delete(d.legs, t)
	d.mu.Unlock()
	if ch == nil {
		http.Error(w, "unknown ticket", http.StatusForbidden)
		return
	}
	if ws, err := websocket.Accept(w, r, nil); err == nil {
		ch <- ws
	}
}

func (d *direct) registered() bool { return d.ko.Conn(d.kiteID) != nil }

func (d *direct) open(ctx context.Context) (*kloudTerm, error) {
	tok, err := d.ko.Signer().Token(owner, d.kiteID, time.Minute)
	if err != nil {
		return nil, err
	}
	ticket := rand.Text()
	ch := make(chan *websocket.Conn, 1)
	d.mu.Lock()
	d.legs[ticket] = ch
	d.mu.Unlock()
	p := webterm.ConnectParams{Session: "direct", Cols: 120, Rows: 40, Token: tok,
		Attach: webterm.Attach{URL: d.url + webterm.AttachPath, Ticket: ticket}}
	if err := d.ko.Conn(d.kiteID).Call(ctx, "webterm.connect", p, nil); err != nil {
		return nil, fmt.Errorf("webterm.connect: %w", err)
	}
	select {
	case ws := <-ch:
		ws.SetReadLimit(webterm.MaxFrame)
		return &kloudTerm{ws: ws}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
