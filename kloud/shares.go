package kloud

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/klient/klientapi"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store"
)

// Machine sharing: kloud keeps the truth (Machine.Shares) and pushes it to the machine's klient
// (klient.setShares), which enforces it on its own. The owner or a team admin shares; a shared
// user gets exactly their grant: readonly (watch terminals), terminal (shells as the user's own
// account on the machine, no sudo), full (anything the owner can do on this machine: shells as
// the owner, start and stop). Unsharing closes that user's terminals at once (klient does it when
// its list changes). A grant reaches only its machine: kontrol gives a shared user tokens for
// that machine's agent alone (authorizeKite), each naming that one kite as its audience.

// shareAPI serves machine.share, machine.unshare and machine.shares, and pushes a machine's
// share list to its agent (when it changes, and when the agent registers:
// Server.pushSharesOnRegister). New builds it once (Server.shares).
type shareAPI struct {
	machines *store.Machines
	users    *store.Users
	log      *slog.Logger
	k        shareKloud
}

// shareKloud is what shareAPI uses of kloud's Server: machines as a caller may see them, a
// connection to a machine's agent (agents.go) and the signer of tokens.
type shareKloud interface {
	loadMachine(ctx context.Context, c *Caller, id string) (*model.Machine, error)
	agentConn(ctx context.Context, m *model.Machine) (agentCaller, error)
	Signer() *kitekey.Signer
	// syncBucketShares gives the users the stack's machines are shared with their access to
	// its buckets, and takes it from those no longer shared (buckets.go).
	syncBucketShares(ctx context.Context, stackID string) error
}

func validGrant(g string) bool {
	return g == model.GrantReadonly || g == model.GrantTerminal || g == model.GrantFull
}

// target loads machine id for a change of its shares, which only its owner or a team admin makes.
func (a *shareAPI) target(ctx context.Context, c *Caller, id string) (*model.Machine, error) {
	m, err := a.k.loadMachine(ctx, c, id)
	if err != nil {
		return nil, err
	}
	if m.Owner != c.Username && !c.TeamAdmin(m.Team) {
		return nil, fmt.Errorf("only the owner of machine %s (or a team admin) shares it: %w", m.Label, kite.ErrPermission)
	}
	return m, nil
}

// share serves machine.share.
func (a *shareAPI) share(ctx context.Context, c *Caller, _ *kite.Request, p *api.ShareParams) (api.SharesResult, error) {
	if !validGrant(p.Grant) {
		return api.SharesResult{}, fmt.Errorf("grant %q: want %s, %s or %s: %w", p.Grant, model.GrantReadonly, model.GrantTerminal, model.GrantFull, kite.ErrInvalidParams)
	}
	m, err := a.target(ctx, c, p.MachineID)
	if err != nil {
		return api.SharesResult{}, err
	}
	if p.Username == m.Owner {
		return api.SharesResult{}, fmt.Errorf("%s owns machine %s: %w", p.Username, m.Label, kite.ErrInvalidParams)
	}
	if _, err := a.users.Get(ctx, p.Username); errors.Is(err, store.ErrNotFound) {
		return api.SharesResult{}, fmt.Errorf("user %q: %w (add it first: kloud user add %s)", p.Username, kite.ErrNotFound, p.Username)
	} else if err != nil {
		return api.SharesResult{}, err
	}
	return a.update(ctx, m, func(sh []model.Share) []model.Share {
		out := []model.Share{{Username: p.Username, Grant: p.Grant}}
		for _, x := range sh {
			if x.Username != p.Username {
				out = append(out, x)
			}
		}
		return out
	})
}

// unshare serves machine.unshare.
func (a *shareAPI) unshare(ctx context.Context, c *Caller, _ *kite.Request, p *api.ShareParams) (api.SharesResult, error) {
	m, err := a.target(ctx, c, p.MachineID)
	if err != nil {
		return api.SharesResult{}, err
	}
	return a.update(ctx, m, func(sh []model.Share) []model.Share {
		out := []model.Share{}
		for _, x := range sh {
			if x.Username != p.Username {
				out = append(out, x)
			}
		}
		return out
	})
}

// list serves machine.shares.
func (a *shareAPI) list(ctx context.Context, c *Caller, _ *kite.Request, p *api.MachineRef) (api.SharesResult, error) {
	m, err := a.k.loadMachine(ctx, c, p.MachineID)
	if err != nil {
		return api.SharesResult{}, err
	}
	if m.Shares == nil {
		m.Shares = []model.Share{}
	}
	return api.SharesResult{MachineID: m.ID, Shares: m.Shares}, nil
}

// update changes a machine's share list with one conditional update (retried if someone
// changed the machine in between), then pushes the list to its agent.
func (a *shareAPI) update(ctx context.Context, m *model.Machine, change func([]model.Share) []model.Share) (api.SharesResult, error) {
	for attempt := 0; ; attempt++ {
		shares := change(m.Shares)
		ok, err := a.machines.SetShares(ctx, m.ID, m.UpdatedAt, shares)
		if err != nil {
			return api.SharesResult{}, fmt.Errorf("save shares: %w", err)
		}
		if ok {
			m.Shares = shares
			break
		}
		if attempt > 10 {
			return api.SharesResult{}, fmt.Errorf("machine %s keeps changing; try again: %w", m.Label, kite.ErrConflict)
		}
		fresh, err := a.k.loadMachine(ctx, nil, m.ID)
		if err != nil {
			return api.SharesResult{}, err
		}
		m = fresh
	}
	if err := a.k.syncBucketShares(ctx, m.StackID); err != nil {
		a.log.WarnContext(ctx, "shares saved; the bucket access they give is not (the next change of shares or build tries again)", "machine", m.ID, "err", err)
	}
	err := a.push(ctx, m)
	if err != nil {
		a.log.InfoContext(ctx, "shares saved; the agent gets them when it connects", "machine", m.ID, "err", err)
	}
	return api.SharesResult{MachineID: m.ID, Shares: m.Shares, Pushed: err == nil}, nil
}

// push gives the machine's klient its complete share list, with a token of the owner's
// (klient checks it like any other call).
func (a *shareAPI) push(ctx context.Context, m *model.Machine) error {
	conn, err := a.k.agentConn(ctx, m)
	if err != nil {
		return err
	}
	tok, err := a.k.Signer().Token(m.Owner, m.KiteID, 5*time.Minute)
	if err != nil {
		return err
	}
	shares := m.Shares
	if shares == nil {
		shares = []model.Share{}
	}
	if !agentHas(ctx, conn, klientapi.FeatureOwnAccountShells) {
		// A klient from before own-account shells gives a terminal share the owner's account
		// (with sudo, so the machine's key): it gets terminal grants as readonly until the
		// machine is rebuilt with a current klient.
		down := make([]model.Share, len(shares))
		for i, sh := range shares {
			down[i] = sh
			if sh.Grant == model.GrantTerminal {
				down[i].Grant = model.GrantReadonly
				a.log.WarnContext(ctx, "the machine's klient predates own-account shells: its terminal share is enforced as readonly until the machine is rebuilt",
					"machine", m.ID, "user", sh.Username)
			}
		}
		shares = down
	}
	p := klientapi.SetSharesParams{Shares: make([]klientapi.Share, len(shares)), Token: tok}
	for i, sh := range shares {
		p.Shares[i] = klientapi.Share{Username: sh.Username, Grant: sh.Grant}
	}
	return conn.Call(ctx, klientapi.MethodSetShares, &p, nil)
}

// agentHas reports whether the agent on conn lists feature (klientapi.Feature*) in its
// klient.info.
func agentHas(ctx context.Context, conn agentCaller, feature string) bool {
	var info klientapi.Info
	if err := conn.Call(ctx, klientapi.MethodInfo, nil, &info); err != nil {
		return false
	}
	return slices.Contains(info.Features, feature)
}

// pushSharesOnRegister re-pushes a machine's share list when its agent (re)registers, so a list
// changed while it was away is enforced (agents.go; shareAPI.pushOnRegister).
func (s *Server) pushSharesOnRegister(ctx context.Context, kiteID string) {
	s.shares.pushOnRegister(ctx, kiteID)
}

// pushOnRegister re-pushes the share list of the machine of agent kiteID (Server.pushSharesOnRegister).
func (a *shareAPI) pushOnRegister(ctx context.Context, kiteID string) {
	m, err := a.machines.ByKite(ctx, kiteID)
	if err != nil {
		if !errors.Is(err, store.ErrNotFound) && ctx.Err() == nil {
			a.log.WarnContext(ctx, "load machine of a registering agent", "kite", kiteID, "err", err)
		}
		return
	}
	if err := a.push(ctx, &m); err != nil && ctx.Err() == nil {
		a.log.WarnContext(ctx, "push shares to agent", "machine", m.ID, "err", err)
	}
}
