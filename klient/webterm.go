package klient

import (
	"context"
	"fmt"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/klient/klientapi"
	"github.com/kloud-dev/kloud/klient/webterm"
)

// Web terminal methods (package webterm has the sessions; docs/protocol.md "Web terminal" the
// wire). Each takes the end user's token and is checked against the access list (share.go).
//
// Which account a shell runs as follows the grant: the owner and full shares get the owner's
// account (with its sudo: full "can do anything the owner can do on this machine"); a terminal
// share gets the user's OWN account on the machine (webterm.SharedAccount: created on demand, no
// sudo), so /etc/kloud/kite.key (0400 root) and the owner's files stay out of reach; readonly
// only watches. A terminal share types into, and resizes, only sessions that run as its own
// account; it may watch the others.
//
//
//	webterm.connect {session?, cols, rows, mode?, token, attach: {url, ticket}} → {session, mode, created}
//	webterm.list    {token}                        → {sessions: [...]}  (any grant)
//	webterm.kill    {session, token}               owner/full any session; terminal its own
//	webterm.rename  {session, name, token}         as kill
//	webterm.resize  {session, cols, rows, token}   terminal or more
//
// webterm.connect dials attach.url (kloud's attach endpoint on the origin klient reaches
// kontrol at, nothing else) and serves the attachment over that WebSocket; the call returns
// once it is attached.

// attachDialTimeout bounds dialing kloud's attach endpoint.
const attachDialTimeout = 15 * time.Second

func (kl *Klient) handleWebterm() {
	kl.kite.Handle(klientapi.MethodWebtermConnect, kite.Typed(kl.webtermConnect), kite.WithTimeout(time.Minute))
	kl.kite.Handle(klientapi.MethodWebtermList, kite.Typed(kl.webtermList))
	kl.kite.Handle(klientapi.MethodWebtermKill, kite.Typed(kl.webtermKill), kite.WithTimeout(time.Minute))
	kl.kite.Handle(klientapi.MethodWebtermRename, kite.Typed(kl.webtermRename))
	kl.kite.Handle(klientapi.MethodWebtermResize, kite.Typed(kl.webtermResize))
}

func (kl *Klient) webtermConnect(ctx context.Context, r *kite.Request, p *webterm.ConnectParams) (any, error) {
	mode := p.Mode
	if mode == "" {
		mode = klientapi.DefaultMode(p.Session)
	}
	need := permTerminal
	if mode == webterm.ModeReadonly {
		need = permView
	}
	user, role, err := kl.authorize(ctx, r, p.Token, need)
	if err != nil {
		return nil, err
	}
	open := webterm.OpenRequest{Session: p.Session, User: user, Mode: mode, Cols: p.Cols, Rows: p.Rows}
	if mode != webterm.ModeReadonly {
		if open.RunAs, open.AnyAccount, err = kl.runAs(ctx, user, role); err != nil {
			return nil, err
		}
	}
	if mode == webterm.ModeShared || mode == webterm.ModeReadonly {
		if _, err := kl.term.Info(p.Session); err != nil { // fail before dialing
			return nil, err
		}
	}
	dctx, cancel := context.WithTimeout(ctx, attachDialTimeout)
	ws, err := webterm.Dial(dctx, p.Attach, kl.opts.KontrolURL, kl.hc)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("webterm.connect: %w: %w", err, kite.ErrState)
	}
	v, created, err := kl.term.Open(open)
	if err != nil {
		ws.Close(webterm.CloseRefused, truncate(err.Error(), 120))
		return nil, err
	}
	// An unshare between authorize and Open must not leave this viewer behind.
	if role := kl.roleOf(user); !allowed(role, need) || (!v.ReadOnly() && !kl.mayType(user, role, v.RunAs())) {
		v.Close()
		ws.Close(webterm.CloseUnshared, "this machine is no longer shared with you")
		return nil, fmt.Errorf("webterm.connect: this machine is no longer shared with %s: %w", user, kite.ErrPermission)
	}
	kl.log.Info("webterm attached", "session", v.Session(), "user", user, "mode", v.Mode(), "created", created)
	go webterm.Serve(kl.ctx, ws, v, webterm.ServeOptions{Logger: kl.log})
	return webterm.ConnectResult{Session: v.Session(), Mode: v.Mode(), Created: created}, nil
}

func (kl *Klient) webtermList(ctx context.Context, r *kite.Request, p *webterm.TokenParams) (any, error) {
	if _, _, err := kl.authorize(ctx, r, p.Token, permView); err != nil {
		return nil, err
	}
	return webterm.ListResult{Sessions: kl.term.List()}, nil
}

// mayManage checks that user (with role) may kill or rename session: owner and full any,
// terminal only the sessions it created.
func (kl *Klient) mayManage(user, role, session string) error {
	in, err := kl.term.Info(session)
	if err != nil {
		return err
	}
	if allowed(role, permManage) || in.CreatedBy == user {
		return nil
	}
	return fmt.Errorf("session %q was started by %s; a %s share may manage only its own: %w", session, in.CreatedBy, role, kite.ErrPermission)
}

func (kl *Klient) webtermKill(ctx context.Context, r *kite.Request, p *webterm.SessionParams) (any, error) {
	user, role, err := kl.authorize(ctx, r, p.Token, permTerminal)
	if err != nil {
		return nil, err
	}
	if err := kl.mayManage(user, role, p.Session); err != nil {
		return nil, err
	}
	if err := kl.term.Kill(p.Session, "session ended: killed by "+user); err != nil {
		return nil, err
	}
	return map[string]string{"session": p.Session}, nil
}

func (kl *Klient) webtermRename(ctx context.Context, r *kite.Request, p *webterm.RenameParams) (any, error) {
	user, role, err := kl.authorize(ctx, r, p.Token, permTerminal)
	if err != nil {
		return nil, err
	}
	if err := kl.mayManage(user, role, p.Session); err != nil {
		return nil, err
	}
	if err := kl.term.Rename(p.Session, p.Name); err != nil {
		return nil, err
	}
	return kl.term.Info(p.Session)
}

func (kl *Klient) webtermResize(ctx context.Context, r *kite.Request, p *webterm.ResizeParams) (any, error) {
	user, role, err := kl.authorize(ctx, r, p.Token, permTerminal)
	if err != nil {
		return nil, err
	}
	in, err := kl.term.Info(p.Session)
	if err != nil {
		return nil, err
	}
	if !kl.mayType(user, role, in.RunAs) {
		return nil, fmt.Errorf("webterm.resize: session %q runs as %s; a %s share resizes only its own account's sessions: %w", p.Session, in.RunAs, role, kite.ErrPermission)
	}
	if err := kl.term.Resize(p.Session, p.Cols, p.Rows); err != nil {
		return nil, err
	}
	return kl.term.Info(p.Session)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// runAs is the account user's new sessions run as, and whether they may type into sessions of
// any account: the owner's for the owner and full shares, the user's own (created if needed)
// for a terminal share.
func (kl *Klient) runAs(ctx context.Context, user, role string) (account string, any bool, err error) {
	if allowed(role, permExec) { // owner, full
		return kl.opts.Owner, true, nil
	}
	account, err = webterm.SharedAccount(ctx, kl.opts.Root, user)
	if err != nil {
		return "", false, fmt.Errorf("webterm.connect: %w", err)
	}
	return account, false, nil
}

// mayType reports whether user, with role, may type into (and resize) a session that runs as
// account runAs.
func (kl *Klient) mayType(user, role, runAs string) bool {
	switch {
	case allowed(role, permExec): // owner, full
		return true
	case allowed(role, permTerminal):
		own, err := webterm.SharedAccountName(user)
		return err == nil && runAs == own
	}
	return false
}
