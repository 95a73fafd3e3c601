package klient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/klient/klientapi"
	"github.com/kloud-dev/kloud/klient/webterm"
)

// Sharing: klient's own access list. kloud keeps the truth (the machine's shares) and pushes it
// here with klient.share / klient.unshare / klient.setShares (on every registration too);
// klient persists it in its state dir, so a restarted klient enforces the last list it had
// before kloud pushes again. Every call that acts for an end user carries a kite token minted
// by kloud for that user (sub = user, aud = this klient); klient verifies it and then applies
// this list: the owner may do everything; a shared user only what the grant allows; nobody
// else anything.
//
//	klient.share     {username, grant, token}  owner only; grant readonly|terminal|full
//	klient.unshare   {username, token}         owner only; closes the user's terminals at once
//	klient.setShares {shares: [{username, grant}], token}  owner only; replaces the list
//	klient.shared    {token}                   owner only → {shares: [{username, grant}]}

// Grants a machine can be shared with (klientapi's).
const (
	GrantReadonly = klientapi.GrantReadonly
	GrantTerminal = klientapi.GrantTerminal
	GrantFull     = klientapi.GrantFull
	roleOwner     = "owner"
)

// SharesFile is the access list's file in the state dir.
const SharesFile = "shares.json"

// perm is something a caller may be allowed to do.
type perm int

const (
	permView     perm = iota // list sessions, attach read-only
	permTerminal             // create/attach/type/resize, kill or rename sessions one created
	permManage               // kill or rename any session
	permExec                 // run commands (exec)
	permShare                // change the access list
)

var permNames = map[perm]string{
	permView: "watch terminals", permTerminal: "use terminals", permManage: "manage other users' sessions",
	permExec: "run commands", permShare: "share the machine",
}

// allowed reports whether role (roleOwner or a grant) includes p.
func allowed(role string, p perm) bool {
	switch role {
	case roleOwner:
		return true
	case GrantFull:
		return p <= permExec
	case GrantTerminal:
		return p <= permTerminal
	case GrantReadonly:
		return p == permView
	}
	return false
}

// acl is the persisted access list.
type acl struct {
	path string
	mu   sync.Mutex
	m    map[string]string // username → grant
}

func loadACL(path string) (*acl, error) {
	a := &acl{path: path, m: map[string]string{}}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return a, nil
	}
	if err != nil {
		return nil, fmt.Errorf("shares: %w", err)
	}
	var f struct{ Shares []Share }
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("shares: %s: %w", path, err)
	}
	for _, s := range f.Shares {
		if s.Username != "" && klientapi.ValidGrant(s.Grant) {
			a.m[s.Username] = s.Grant
		}
	}
	return a, nil
}

func (a *acl) grant(user string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.m[user]
}

func (a *acl) list() []Share {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.listLocked()
}

func (a *acl) listLocked() []Share {
	out := make([]Share, 0, len(a.m))
	for u, g := range a.m {
		out = append(out, Share{Username: u, Grant: g})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Username < out[j].Username })
	return out
}

// update applies f to a copy of the list, saves it, and returns the grants before and after.
func (a *acl) update(f func(m map[string]string)) (before, after map[string]string, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	next := make(map[string]string, len(a.m))
	for u, g := range a.m {
		next[u] = g
	}
	f(next)
	prev := a.m
	a.m = next
	if err := a.saveLocked(); err != nil {
		a.m = prev
		return nil, nil, err
	}
	return prev, next, nil
}

func (a *acl) saveLocked() error {
	b, err := json.MarshalIndent(struct {
		Shares []Share `json:"shares"`
	}{a.listLocked()}, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(a.path), 0o700); err != nil {
		return fmt.Errorf("shares: %w", err)
	}
	tmp := a.path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("shares: %w", err)
	}
	if err := os.Rename(tmp, a.path); err != nil {
		return fmt.Errorf("shares: %w", err)
	}
	return nil
}

// authorize verifies a call's token and returns the end user and their role, if the role
// allows need. Tokens must be for this klient; on a direct connection (klient --listen) the
// token must also be the connection's own user.
func (kl *Klient) authorize(ctx context.Context, r *kite.Request, token string, need perm) (user, role string, err error) {
	if token == "" {
		return "", "", fmt.Errorf("%s: a token is required (a kite token for this klient, minted by kloud for the user): %w", r.Method, kite.ErrAuth)
	}
	c, err := kl.verifier.Token(ctx, token, kl.claims.KiteID)
	if err != nil {
		return "", "", fmt.Errorf("%s: %w", r.Method, err)
	}
	user = c.Subject
	if !r.Conn.Dialed() {
		if p := r.Principal(); p == nil || p.Username != user {
			return "", "", fmt.Errorf("%s: the token is %s's, not the caller's: %w", r.Method, user, kite.ErrPermission)
		}
	}
	role = kl.roleOf(user)
	switch {
	case role == "":
		return "", "", fmt.Errorf("%s: this machine is not shared with %s: %w", r.Method, user, kite.ErrPermission)
	case !allowed(role, need):
		return "", "", fmt.Errorf("%s: %s has a %s share, which does not allow to %s: %w", r.Method, user, role, permNames[need], kite.ErrPermission)
	}
	return user, role, nil
}

func (kl *Klient) roleOf(user string) string {
	if user == kl.opts.Owner {
		return roleOwner
	}
	return kl.acl.grant(user)
}

func (kl *Klient) handleShares() {
	kl.kite.Handle(klientapi.MethodShare, kite.Typed(kl.share))
	kl.kite.Handle(klientapi.MethodUnshare, kite.Typed(kl.unshare))
	kl.kite.Handle(klientapi.MethodSetShares, kite.Typed(kl.setShares))
	kl.kite.Handle(klientapi.MethodShared, kite.Typed(kl.shared))
}

func (kl *Klient) share(ctx context.Context, r *kite.Request, p *ShareParams) (any, error) {
	if _, _, err := kl.authorize(ctx, r, p.Token, permShare); err != nil {
		return nil, err
	}
	if p.Username == kl.opts.Owner {
		return nil, fmt.Errorf("%s owns this machine: %w", p.Username, kite.ErrInvalidParams)
	}
	before, after, err := kl.acl.update(func(m map[string]string) { m[p.Username] = p.Grant })
	if err != nil {
		return nil, err
	}
	kl.enforce(before, after)
	return SharesResult{Shares: kl.acl.list()}, nil
}

func (kl *Klient) unshare(ctx context.Context, r *kite.Request, p *UnshareParams) (any, error) {
	if _, _, err := kl.authorize(ctx, r, p.Token, permShare); err != nil {
		return nil, err
	}
	before, after, err := kl.acl.update(func(m map[string]string) { delete(m, p.Username) })
	if err != nil {
		return nil, err
	}
	kl.enforce(before, after)
	return SharesResult{Shares: kl.acl.list()}, nil
}

func (kl *Klient) setShares(ctx context.Context, r *kite.Request, p *SetSharesParams) (any, error) {
	if _, _, err := kl.authorize(ctx, r, p.Token, permShare); err != nil {
		return nil, err
	}
	for _, s := range p.Shares {
		if s.Username == kl.opts.Owner {
			return nil, fmt.Errorf("%s owns this machine: %w", s.Username, kite.ErrInvalidParams)
		}
	}
	before, after, err := kl.acl.update(func(m map[string]string) {
		clear(m)
		for _, s := range p.Shares {
			m[s.Username] = s.Grant
		}
	})
	if err != nil {
		return nil, err
	}
	kl.enforce(before, after)
	return SharesResult{Shares: kl.acl.list()}, nil
}

func (kl *Klient) shared(ctx context.Context, r *kite.Request, p *webterm.TokenParams) (any, error) {
	if _, _, err := kl.authorize(ctx, r, p.Token, permShare); err != nil {
		return nil, err
	}
	return SharesResult{Shares: kl.acl.list()}, nil
}

// enforce closes, at once, the attachments a change of the list took away: all of an unshared
// user's, the writable ones of a user now read-only. A user who may no longer use terminals also
// loses what runs as their own account: its sessions and every process of its uid end, and the
// account is expired until they are given a terminal share again.
func (kl *Klient) enforce(before, after map[string]string) {
	for u, g := range before {
		ng := after[u]
		if ng != g && !allowed(ng, permTerminal) {
			defer kl.revokeAccount(u)
		}
		if ng != g {
			kl.closeSSH(u) // ssh.go: it reconnects with what the new grant gives
		}
		switch {
		case ng == g:
		case ng == "":
			if n := kl.term.CloseViewers(u, nil, webterm.CloseUnshared, "this machine is no longer shared with you"); n > 0 {
				kl.log.Info("unshared: closed terminals", "user", u, "count", n)
			}
		case !allowed(ng, permTerminal):
			kl.term.CloseViewers(u, func(v *webterm.Viewer) bool { return !v.ReadOnly() }, webterm.CloseUnshared, "your share of this machine is now read-only")
		default: // still typing, maybe no longer as the owner (full → terminal)
			kl.term.CloseViewers(u, func(v *webterm.Viewer) bool { return !v.ReadOnly() && !kl.mayType(u, ng, v.RunAs()) },
				webterm.CloseUnshared, "your share of this machine no longer includes the owner's account")
		}
	}
}

// revokeAccount ends the sessions and processes of user's own account and expires it.
func (kl *Klient) revokeAccount(user string) {
	account, err := webterm.SharedAccountName(user)
	if err != nil {
		return
	}
	n := kl.term.KillRunAs(account, "session ended: this machine is no longer shared with "+user+" for terminals")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	killed, err := webterm.RevokeSharedAccount(ctx, kl.opts.Root, user)
	if err != nil {
		kl.log.Warn("revoke shared user's account", "user", user, "err", err)
	}
	if n > 0 || killed > 0 {
		kl.log.Info("revoked shared user's account", "user", user, "sessions", n, "processes", killed)
	}
}
