package kloud

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/klient/klientapi"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/stackbuild"
)

// Handover: a claimed pool stack's machines get their owner's agent keys without a rebuild.
// Built for the pool, each machine's agent key, account and klient are model.PoolOwner's; on
// claim kloud mints the owner's key (recorded, sealed, on the machine before anything else, so a
// handover cut by a restart goes on with the same key), sends it to klient (klient.adopt:
// klient renames the account, writes the key and restarts in place), waits for the new kite id
// to register, records it as the machine's agent and revokes the pool's key. The machine keeps
// the agent configuration it was built with for its renders (store.Machines.FinishHandover), so
// a later stack.apply or update leaves it as it is.

// handoverTimeout bounds one machine's handover: klient's answer, its restart and registration.
const handoverTimeout = 2 * time.Minute

// handOver gives machine m of stack st (claimed: st.Owner is its user) its owner's agent key. It
// is idempotent: called again after a cut, it goes on from what the machine's record says.
func (s *Server) handOver(ctx context.Context, st *model.Stack, m model.Machine) error {
	ctx, cancel := context.WithTimeout(ctx, handoverTimeout)
	defer cancel()
	f := s.flow()
	if m.HandoverKiteID == "" {
		cfg, ok := f.OpenAgent(&m)
		if !ok {
			return fmt.Errorf("machine %s: no agent configuration to hand over: %w", m.Label, kite.ErrState)
		}
		key, kiteID, err := s.Kontrol.CreateAgentKey(kitekey.AgentKeySpec{Owner: st.Owner, MachineID: m.ID, StackID: st.ID, KontrolURL: cfg.KontrolURL})
		if err != nil {
			return fmt.Errorf("machine %s: %w", m.Label, err)
		}
		cfg.Username, cfg.KiteKey = st.Owner, key
		sealed, err := f.SealAgents(stackbuild.AgentConfigs{m.ID: cfg})
		if err != nil {
			return err
		}
		if _, err := s.store.Machines().SetHandover(ctx, m.ID, kiteID, sealed[m.ID]); err != nil {
			return fmt.Errorf("machine %s: record its handover: %w", m.Label, err)
		}
		if m, err = s.store.Machines().Get(ctx, m.ID); err != nil { // ours, or one recorded meanwhile
			return err
		}
	}
	next := m
	next.KiteID, next.AgentSealed = m.HandoverKiteID, m.HandoverSealed
	cfg, ok := f.OpenAgent(&next)
	if !ok {
		return fmt.Errorf("machine %s: its handover's configuration cannot be opened: %w", m.Label, kite.ErrState)
	}
	if s.Kontrol.Conn(next.KiteID) == nil { // not taken yet (or taken, and registered elsewhere: adopt answers Already)
		conn, err := s.agentConn(ctx, &m)
		if err != nil {
			return fmt.Errorf("machine %s: its agent: %w", m.Label, err)
		}
		var info klientapi.Info
		if err := conn.Call(ctx, klientapi.MethodInfo, nil, &info); err != nil {
			return fmt.Errorf("machine %s: klient.info: %w", m.Label, err)
		}
		if !slices.Contains(info.Features, klientapi.FeatureAdopt) {
			return fmt.Errorf("machine %s: its klient %s cannot change owners: %w", m.Label, info.Version, kite.ErrState)
		}
		var res klientapi.AdoptResult
		if err := conn.Call(ctx, klientapi.MethodAdopt, klientapi.AdoptParams{Owner: st.Owner, Key: cfg.KiteKey}, &res); err != nil {
			return fmt.Errorf("machine %s: klient.adopt: %w", m.Label, err)
		}
		s.log.InfoContext(ctx, "machine handed over", "machine", m.ID, "stack", st.ID, "owner", st.Owner, "account", res.Account, "kite", next.KiteID)
	}
	agent, err := (kontrolAgents{k: s.Kontrol, s: s}).WaitRegistered(ctx, next.KiteID)
	if err != nil {
		return fmt.Errorf("machine %s: its agent did not register with its owner's key: %w", m.Label, err)
	}
	if _, err := s.store.Machines().FinishHandover(ctx, m.ID, next.KiteID); err != nil {
		return fmt.Errorf("machine %s: record its new agent: %w", m.Label, err)
	}
	// Its registration came before the machine's record named its kite id: say it now.
	version := ""
	if c, ok := agent.(*kite.Conn); ok {
		version = c.Peer().Version
	}
	s.setAgent(ctx, next.KiteID, model.AgentConnected, version)
	if m.KiteID != "" && m.KiteID != next.KiteID {
		if err := s.Kontrol.Revoke(context.WithoutCancel(ctx), m.KiteID, "machine handed to "+st.Owner); err != nil {
			s.log.WarnContext(ctx, "revoke a handed-over machine's pool key", "kite", m.KiteID, "err", err)
		}
	}
	return nil
}
