package klient

import (
	"context"
	"fmt"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/klient/klientapi"
	"github.com/kloud-dev/kloud/klient/webterm"
)

// klient.adopt (klientapi.MethodAdopt): a machine changes hands without a rebuild. kloud builds
// a prebuilt stack's machines for its pool account; when a user claims the stack, kloud mints
// the user's agent key and sends it here. klient checks it, ends the old owner's sessions,
// renames the owner's account (webterm.RenameOwnerAccount), forgets the old owner's shares,
// writes the key over its kite.key and restarts in place (as klient.upgrade does: same pid,
// same arguments, the key's owner being the owner since klient was started without --owner),
// registering with the new key's kite id. kloud revokes the old key once the new one registered.

func (kl *Klient) handleAdopt() {
	kl.kite.Handle(klientapi.MethodAdopt, kite.Typed(kl.adopt), kite.WithTimeout(2*time.Minute))
}

func (kl *Klient) adopt(ctx context.Context, r *kite.Request, p *klientapi.AdoptParams) (any, error) {
	if !r.Conn.Dialed() {
		return nil, fmt.Errorf("%s: only kloud, on the connection klient dialed, hands a machine over: %w", r.Method, kite.ErrPermission)
	}
	if kl.opts.Vagrant != nil {
		return nil, fmt.Errorf("%s: a vagrant host's klient is its owner's and has no machine to hand over: %w", r.Method, kite.ErrState)
	}
	nk, err := kitekey.ParseKeyFile(p.Key)
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %w", r.Method, err, kite.ErrInvalidParams)
	}
	switch {
	case nk.Kind != kitekey.KindAgentKey:
		return nil, fmt.Errorf("%s: the key is a %s, not an agent key: %w", r.Method, nk.Kind, kite.ErrInvalidParams)
	case nk.Issuer != kl.claims.Issuer:
		return nil, fmt.Errorf("%s: the key is from %q, this klient's from %q: %w", r.Method, nk.Issuer, kl.claims.Issuer, kite.ErrInvalidParams)
	case nk.MachineID != kl.claims.MachineID:
		return nil, fmt.Errorf("%s: the key is machine %s's, this is machine %s: %w", r.Method, nk.MachineID, kl.claims.MachineID, kite.ErrInvalidParams)
	case nk.Owner != p.Owner:
		return nil, fmt.Errorf("%s: the key's owner is %q, not %q: %w", r.Method, nk.Owner, p.Owner, kite.ErrInvalidParams)
	}
	res := klientapi.AdoptResult{OldOwner: kl.opts.Owner, Owner: p.Owner, KiteID: nk.KiteID}
	if nk.KiteID == kl.claims.KiteID {
		res.Already, res.Account = true, "already"
		return res, nil
	}
	if kl.ownerFlag {
		return nil, fmt.Errorf("%s: this klient was started with --owner %s, which its restart would keep: %w", r.Method, kl.opts.Owner, kite.ErrState)
	}
	exe, unlock, err := kl.beginRestart(r.Method)
	if err != nil {
		return nil, err
	}
	defer unlock()
	res.Ended = kl.term.KillRunAs(kl.opts.Owner, "session ended: this machine was handed to "+p.Owner)
	if res.Account, err = webterm.RenameOwnerAccount(ctx, kl.opts.Root, kl.opts.Owner, p.Owner); err != nil {
		return nil, fmt.Errorf("%s: %w", r.Method, err)
	}
	before, after, err := kl.acl.update(func(m map[string]string) { clear(m) })
	if err != nil {
		return nil, fmt.Errorf("%s: forget the shares: %w: %w", r.Method, err, kite.ErrState)
	}
	kl.enforce(before, after)
	if err := kitekey.WriteFile(kl.opts.KiteKeyFile, p.Key); err != nil {
		return nil, fmt.Errorf("%s: %w: %w", r.Method, err, kite.ErrState)
	}
	kl.log.Info("machine handed over: restarting as the new owner's agent", "old_owner", res.OldOwner, "owner", p.Owner,
		"kite_id", nk.KiteID, "account", res.Account, "sessions_ended", res.Ended)
	kl.restartSoon(exe)
	return res, nil
}
