package kloud

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/klient/klientapi"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store"
)

// Agent upgrades: machine.upgradeAgent makes a machine's klient replace itself with the klient
// binary kloud serves at /dl/klient (klient.upgrade: download, checksum, trial run, atomic
// rename, re-exec in place) and waits for it to register again; terminal sessions live in
// holder processes and survive it. With --agent-rollout=auto (the default) kloud does the same
// for every agent that registers with a klient whose sha256 is not the one kloud serves, at
// most rolloutConcurrency at a time, once per agent and binary (a failure is logged, not
// retried until kloud serves another binary or restarts).

// rolloutConcurrency bounds the upgrades of a rollout running at once.
const rolloutConcurrency = 4

// agentUpgradeTimeout bounds one upgrade: the download, klient's restart and its registration.
const agentUpgradeTimeout = 5 * time.Minute

// agentAPI serves machine.upgradeAgent and the rollout.
type agentAPI struct {
	machines    *store.Machines
	loadMachine func(ctx context.Context, c *Caller, id string) (*model.Machine, error)
	agentConn   func(ctx context.Context, m *model.Machine) (agentCaller, error)
	conn        func(kiteID string) *kite.Conn // the agent's registration now (nil: none)
	klientSum   func() string
	rollout     string // api.AgentRollout*
	log         *slog.Logger

	sem     chan struct{}
	mu      sync.Mutex
	tried   map[string]string // kite id → the sum the rollout tried to give it
	running map[string]bool   // kite ids being upgraded now
}

// init makes a's rollout state; it returns a.
func (a *agentAPI) init() *agentAPI {
	a.sem, a.tried, a.running = make(chan struct{}, rolloutConcurrency), map[string]string{}, map[string]bool{}
	return a
}

// upgrade serves machine.upgradeAgent: owner, team admins and kloud owners.
func (a *agentAPI) upgrade(ctx context.Context, c *Caller, _ *kite.Request, p *api.MachineRef) (api.UpgradeAgentResult, error) {
	m, err := a.loadMachine(ctx, c, p.MachineID)
	if err != nil {
		return api.UpgradeAgentResult{}, err
	}
	if !c.Admin && c.KloudRole != model.RoleOwner && !c.CanManage(m.Owner, m.Team) {
		return api.UpgradeAgentResult{}, fmt.Errorf("machine %s belongs to %s: only its owner, team admins and kloud owners upgrade its agent: %w", m.Label, m.Owner, kite.ErrPermission)
	}
	return a.upgradeMachine(ctx, m)
}

// upgradeMachine upgrades m's agent to the klient kloud serves and waits for it to register.
func (a *agentAPI) upgradeMachine(ctx context.Context, m *model.Machine) (api.UpgradeAgentResult, error) {
	res := api.UpgradeAgentResult{MachineID: m.ID, Label: m.Label}
	sum := a.klientSum()
	if sum == "" {
		return res, fmt.Errorf("this kloud serves no klient binary (kloud serve --klient-bin): %w", kite.ErrState)
	}
	if !a.begin(m.KiteID) {
		return res, fmt.Errorf("machine %s: its agent is being upgraded already: %w", m.Label, kite.ErrConflict)
	}
	defer a.end(m.KiteID)
	conn, err := a.agentConn(ctx, m)
	if err != nil {
		return res, err
	}
	ctx, cancel := context.WithTimeout(ctx, agentUpgradeTimeout)
	defer cancel()
	var info klientapi.Info
	if err := conn.Call(ctx, klientapi.MethodInfo, nil, &info); err != nil {
		return res, fmt.Errorf("machine %s: klient.info: %w", m.Label, err)
	}
	res.OldVersion, res.OldSHA256, res.NewVersion, res.NewSHA256 = info.Version, info.SHA256, info.Version, info.SHA256
	if info.SHA256 == sum {
		return res, nil // already the klient kloud serves
	}
	if !slices.Contains(info.Features, klientapi.FeatureUpgrade) {
		return res, fmt.Errorf("machine %s: its klient %s predates agent upgrades: rebuild the machine to replace it: %w", m.Label, info.Version, kite.ErrState)
	}
	var up klientapi.UpgradeResult
	if err := conn.Call(ctx, klientapi.MethodUpgrade, klientapi.UpgradeParams{SHA256: sum}, &up); err != nil {
		return res, fmt.Errorf("machine %s: klient.upgrade (the old klient keeps running): %w", m.Label, err)
	}
	res.Upgraded, res.Sessions, res.NewVersion, res.NewSHA256 = true, up.Sessions, up.NewVersion, up.NewSHA256
	// klient re-executes itself: wait for the new one's registration and ask it. An agent of
	// another replica (mesh.go) may come back to any replica: asked through agentConn until it
	// answers with the new binary.
	_, local := conn.(*kite.Conn)
	for {
		if !local {
			if c, err := a.agentConn(ctx, m); err == nil {
				var now klientapi.Info
				if err := c.Call(ctx, klientapi.MethodInfo, nil, &now); err == nil && now.SHA256 == sum {
					res.NewVersion = now.Version
					a.log.InfoContext(ctx, "agent upgraded", "machine", m.ID, "old", res.OldVersion, "new", res.NewVersion, "sessions", res.Sessions)
					return res, nil
				}
			}
		} else if c := a.conn(m.KiteID); c != nil && c != conn {
			var now klientapi.Info
			if err := c.Call(ctx, klientapi.MethodInfo, nil, &now); err == nil {
				if now.SHA256 != sum {
					return res, fmt.Errorf("machine %s: klient registered again with sha256 %s, not %s: %w", m.Label, now.SHA256, sum, kite.ErrState)
				}
				res.NewVersion = now.Version
				a.log.InfoContext(ctx, "agent upgraded", "machine", m.ID, "old", res.OldVersion, "new", res.NewVersion, "sessions", res.Sessions)
				return res, nil
			}
		}
		select {
		case <-ctx.Done():
			if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return res, fmt.Errorf("machine %s: klient installed the new binary; stopped waiting for it to register again: %w", m.Label, ctx.Err())
			}
			return res, fmt.Errorf("machine %s: klient installed the new binary but did not register again within %s: %w", m.Label, agentUpgradeTimeout, kite.ErrState)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (a *agentAPI) begin(kiteID string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.running[kiteID] {
		return false
	}
	a.running[kiteID] = true
	return true
}

func (a *agentAPI) end(kiteID string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.running, kiteID)
}

// rolloutOnRegister upgrades the agent kiteID that just registered if the rollout is on and
// it runs another klient than kloud serves (once per agent and binary).
func (a *agentAPI) rolloutOnRegister(ctx context.Context, kiteID string) {
	sum := a.klientSum()
	if a.rollout != api.AgentRolloutAuto || sum == "" {
		return
	}
	a.mu.Lock()
	if a.tried[kiteID] == sum || a.running[kiteID] {
		a.mu.Unlock()
		return
	}
	a.mu.Unlock()
	m, err := a.machines.ByKite(ctx, kiteID)
	if err != nil {
		return // not a machine's agent, or the store is away
	}
	conn := a.conn(kiteID)
	if conn == nil {
		return
	}
	var info klientapi.Info
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = conn.Call(cctx, klientapi.MethodInfo, nil, &info)
	cancel()
	if err != nil || info.SHA256 == sum || !slices.Contains(info.Features, klientapi.FeatureUpgrade) {
		return
	}
	a.mu.Lock()
	a.tried[kiteID] = sum
	a.mu.Unlock()
	select {
	case a.sem <- struct{}{}:
	case <-ctx.Done():
		return
	}
	defer func() { <-a.sem }()
	res, err := a.upgradeMachine(ctx, &m)
	if err != nil {
		a.log.WarnContext(ctx, "agent rollout: upgrade failed; the old klient keeps running", "machine", m.ID, "err", err)
		return
	}
	a.log.InfoContext(ctx, "agent rollout: upgraded", "machine", m.ID, "old", res.OldVersion, "new", res.NewVersion)
}
