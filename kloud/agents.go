package kloud

import (
	"context"
	"strings"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/stackbuild"
	"github.com/kloud-dev/kloud/kontrol"
)

// kontrolAgents finds agents through the kontrol kloud hosts (stackbuild.Agents), and through
// the presence records of the other replicas (mesh.go: an agent whose klient the load balancer
// sent to another replica).
type kontrolAgents struct {
	k *kontrol.Kontrol
	s *Server
}

// remotePoll is how often a wait for an agent looks for it at the other replicas (their
// presence records), while there are others (mesh.alone); a registration here is pushed at once.
const remotePoll = 250 * time.Millisecond

// WaitRegistered waits for the kite id to register: subscribe, then look, so a registration
// between the two is not missed; then wait for the push (or find it at another replica).
func (a kontrolAgents) WaitRegistered(ctx context.Context, id string) (stackbuild.Agent, error) {
	for {
		events, now, cancel := a.k.Subscribe(kite.Identity{ID: id})
		c, err := a.wait(ctx, id, events, len(now) > 0)
		cancel()
		if c != nil || err != nil {
			return c, err
		}
		// The registration went away again, or we fell behind: look again.
	}
}

func (a kontrolAgents) wait(ctx context.Context, id string, events <-chan kontrol.Event, registered bool) (stackbuild.Agent, error) {
	poll := time.NewTicker(remotePoll)
	defer poll.Stop()
	for {
		if registered {
			if c := a.k.Conn(id); c != nil {
				return c, nil
			}
		}
		select {
		case <-poll.C:
			if a.s == nil || a.s.mesh.alone() {
				continue
			}
			if c, err := a.s.agentConn(ctx, &model.Machine{KiteID: id, Label: id}); err == nil {
				if _, remote := c.(*remoteAgent); remote {
					return c, nil
				}
			}
		case ev, ok := <-events:
			if !ok {
				return nil, nil
			}
			registered = ev.Action == "register"
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// trackAgents keeps every machine's agent status current from kontrol's registrations.
func (s *Server) trackAgents(ctx context.Context) {
	for ctx.Err() == nil {
		events, now, cancel := s.Kontrol.Subscribe(kite.Identity{})
		for _, k := range now {
			s.setAgent(ctx, k.Kite.ID, model.AgentConnected, k.Kite.Version)
		}
	loop:
		for {
			select {
			case ev, ok := <-events:
				if !ok {
					break loop
				}
				status := model.AgentConnected
				if ev.Action == "deregister" {
					status = model.AgentDisconnected
				}
				s.setAgent(ctx, ev.Kite.Kite.ID, status, ev.Kite.Kite.Version)
				if status == model.AgentConnected && strings.HasPrefix(ev.Kite.Kite.ID, AgentKitePrefix) {
					go s.pushSharesOnRegister(ctx, ev.Kite.Kite.ID)
					go s.buckets.pushOnRegister(ctx, ev.Kite.Kite.ID) // buckets.go
					go s.agents.rolloutOnRegister(ctx, ev.Kite.Kite.ID)
				}
			case <-ctx.Done():
				break loop
			}
		}
		cancel()
	}
}

// setAgent is the one writer of a machine's agent status (connected or disconnected, last seen,
// version): trackAgents calls it for kontrol's registrations, and a build or machine start for
// the agent its Planner just found answering (so the job's end already shows it). A build's
// minting (stackbuild's Mint) resets the record to never-seen together with the machine's new kite id. The
// write is retried for a while (store.Store.Persist), with its own context like other
// bookkeeping. Each replica calls it only for the agents connected to it (kontrol's in-process
// subscription never carries another replica's registrations), and a disconnect is written only
// by the replica the record names (store.Machines.SetAgentOf).
func (s *Server) setAgent(ctx context.Context, kiteID, status, version string) {
	s.setAgentAs(ctx, kiteID, status, version, s.store.InstanceID())
}

// setAgentAs is setAgent written as replica: a disconnect applies only to a record that names
// it (mesh.bury writes a dead replica's disconnects).
func (s *Server) setAgentAs(ctx context.Context, kiteID, status, version, replica string) {
	if !strings.HasPrefix(kiteID, AgentKitePrefix) {
		return // not a machine's agent: no machine document to update
	}
	err := s.store.Persist(ctx, "agent status of "+kiteID, jobNoteTimeout, func(ctx context.Context) error {
		// As this replica (several replicas share the store, ARCHITECTURE §9): a disconnect it
		// notices after the agent reconnected to another replica does not undo that one's.
		_, err := s.store.Machines().SetAgentOf(ctx, kiteID, status, version, replica)
		return err
	})
	if err != nil && ctx.Err() == nil {
		s.log.WarnContext(ctx, "update agent status", "kite", kiteID, "err", err)
	}
}
