package api

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/kloud-dev/kloud/kite"
)

// MethodReplicaAgentCall is called by other kloud replicas only (replica keys), never by users:
// one call for a machine's agent whose connection this replica holds (kloud/mesh.go).
const MethodReplicaAgentCall = "replica.agentCall"

// RPCReplicaAgentCall describes replica.agentCall.
var RPCReplicaAgentCall = Method[ReplicaAgentCallParams, ReplicaAgentCallResult]{Name: MethodReplicaAgentCall}

// ReplicaAgentMethodPrefixes are the klient method families a replica forwards: what kloud
// itself calls on agents (machine info, terminals, SSH, port forwards, shares, buckets,
// upgrades, activity), and kite.ping (the build's planner asks a new agent).
var ReplicaAgentMethodPrefixes = []string{"klient.", "webterm.", "ssh.", "port.", "kite.ping"}

// ReplicaAgentCallParams: call Method with Params on the agent KiteID (an "agent." kite id) over
// its registration connection on the replica called.
type ReplicaAgentCallParams struct {
	KiteID string          `json:"kiteId"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params,omitempty"`
}

// Validate checks the kite id and that the method is one a replica forwards.
func (p *ReplicaAgentCallParams) Validate() error {
	if !strings.HasPrefix(p.KiteID, "agent.") || len(p.KiteID) > 256 {
		return fmt.Errorf("kiteId %q: want a machine agent's kite id: %w", truncate(p.KiteID), kite.ErrInvalidParams)
	}
	for _, pre := range ReplicaAgentMethodPrefixes {
		if strings.HasPrefix(p.Method, pre) && len(p.Method) <= 64 {
			return nil
		}
	}
	return fmt.Errorf("method %q: a replica forwards only %s methods: %w", truncate(p.Method), strings.Join(ReplicaAgentMethodPrefixes, "*, ")+"*", kite.ErrInvalidParams)
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// ReplicaAgentCallResult is the agent's result, as it answered.
type ReplicaAgentCallResult struct {
	Result json.RawMessage `json:"result,omitempty"`
}

// ErrTypeAgentAway is the error data type replica.agentCall answers when the agent is not (or
// no longer) connected to the replica called, or its connection closed during the call, as
// opposed to an error the agent itself answered (passed on unchanged): the caller then looks
// for the agent again instead of giving up.
const ErrTypeAgentAway = "agentAway"

// MethodReplicaPluginCall is called by other kloud replicas only (replica keys), never by users:
// one call for a provider plugin whose connection this replica holds (kloud/mesh_plugins.go).
const MethodReplicaPluginCall = "replica.pluginCall"

// RPCReplicaPluginCall describes replica.pluginCall.
var RPCReplicaPluginCall = Method[ReplicaPluginCallParams, ReplicaPluginCallResult]{Name: MethodReplicaPluginCall}

// ReplicaPluginMethodPrefixes are the method families kloud calls on provider plugins
// (provider/pluginapi): a replica forwards those only.
var ReplicaPluginMethodPrefixes = []string{"provider.", "machine."}

// ReplicaPluginCallParams: call Method with Params on provider plugin Provider's connection on
// the replica called, if it is still the connection Session (the plugin's presence record).
type ReplicaPluginCallParams struct {
	Provider string          `json:"provider"`
	Session  string          `json:"session"`
	Method   string          `json:"method"`
	Params   json.RawMessage `json:"params,omitempty"`
}

// Validate checks the provider name, the session and that the method is one a replica forwards.
func (p *ReplicaPluginCallParams) Validate() error {
	if !providerNameRE.MatchString(p.Provider) {
		return fmt.Errorf("provider %q: want a provider name: %w", truncate(p.Provider), kite.ErrInvalidParams)
	}
	if p.Session == "" || len(p.Session) > 64 {
		return fmt.Errorf("session: want the plugin connection's session from its presence record: %w", kite.ErrInvalidParams)
	}
	for _, pre := range ReplicaPluginMethodPrefixes {
		if strings.HasPrefix(p.Method, pre) && len(p.Method) <= 64 {
			return nil
		}
	}
	return fmt.Errorf("method %q: a replica forwards only %s methods to plugins: %w", truncate(p.Method), strings.Join(ReplicaPluginMethodPrefixes, "*, ")+"*", kite.ErrInvalidParams)
}

// ReplicaPluginCallResult is the plugin's result, as it answered.
type ReplicaPluginCallResult struct {
	Result json.RawMessage `json:"result,omitempty"`
}
