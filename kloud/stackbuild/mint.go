package stackbuild

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/google/uuid"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/userdata"
)

// Machines' agents: the kite key and configuration each gets before a provider renders it into
// the template (Mint), kept sealed on the machine's record so that an update renders a machine
// that stays with the agent it was built with (SealAgents, OpenAgent).

// AgentSource is what a machine's agent is told about kloud (kloud's options and its klient
// binary).
type AgentSource struct {
	// URL is the URL provider p's machines reach kloud at (kloud's public URL, or p's own view
	// of it).
	URL func(p *provider.Provider) string
	// PublicURL is kloud's public URL (a provider kloud no longer has: a preview's placeholder).
	PublicURL string
	// KlientSum is the SHA-256 of the klient binary kloud serves ("": it has none) and
	// KlientBin where kloud looked for it.
	KlientSum, KlientBin string
	CACert               string // PEM the agent trusts kloud with ("" : the system's roots)
}

// Mint prepares every machine's agent before any provider rewrites the template: it mints a
// fresh kite key per machine (its id is what the planner waits for), records the ids on the
// machines (ms too) before Terraform runs, so a restart can still find them, and returns each
// machine's agent configuration for the providers to render into user data.
func (f *Flow) Mint(ctx context.Context, st *model.Stack, ms []model.Machine) (AgentConfigs, error) {
	src := f.d.Agents
	if src.KlientSum == "" {
		return nil, fmt.Errorf("kloud has no klient binary to give machines (looked at %s): %w", src.KlientBin, kite.ErrState)
	}
	out := AgentConfigs{}
	for i := range ms {
		m := &ms[i]
		p, err := f.d.Providers.Lookup(m.Provider)
		if err != nil {
			return nil, fmt.Errorf("machine %s: %w", m.Label, err)
		}
		url := src.URL(p)
		kiteID := kitekey.AgentIDPrefix + uuid.NewString()
		key, _, err := f.d.Kontrol.CreateAgentKey(kitekey.AgentKeySpec{Owner: st.Owner, MachineID: m.ID, StackID: st.ID, KiteID: kiteID, KontrolURL: url + "/kite"})
		if err != nil {
			return nil, fmt.Errorf("machine %s: agent key: %w", m.Label, err)
		}
		out[m.ID] = userdata.Config{
			Username: st.Owner, KiteKey: key, KontrolURL: url + "/kite", KlientURL: url + "/dl/klient", KlientSHA256: src.KlientSum,
			CACert: src.CACert,
		}
		m.KiteID = kiteID
	}
	ids := make(map[string]string, len(ms))
	for _, m := range ms {
		ids[m.ID] = m.KiteID
	}
	sealed, err := f.SealAgents(out) // kept for stack.update
	if err != nil {
		return nil, err
	}
	if err := f.d.Store.Persist(ctx, "record kite ids of stack "+st.ID, 0, func(ctx context.Context) error {
		if err := f.d.Store.Machines().SetKiteIDs(ctx, ids, model.Agent{Status: model.AgentNever}); err != nil {
			return err
		}
		return f.d.Store.Machines().SetAgentSealed(ctx, sealed)
	}); err != nil {
		return nil, fmt.Errorf("record the machines' kite ids: %w", err)
	}
	return out, nil
}

func agentAAD(machineID string) []byte { return []byte("machines/" + machineID + "/agent") }

// SealAgents seals each machine's agent configuration (Mint stores them with the kite ids).
func (f *Flow) SealAgents(cfgs AgentConfigs) (map[string][]byte, error) {
	out := make(map[string][]byte, len(cfgs))
	for id, c := range cfgs {
		c.UserData, c.Hostname = "", "" // the template's and the label's, filled at each render
		b, err := json.Marshal(c)
		if err != nil {
			return nil, fmt.Errorf("machine %s: agent configuration: %w", id, err)
		}
		if out[id], err = f.d.Store.Seal(b, agentAAD(id)); err != nil {
			return nil, fmt.Errorf("machine %s: seal agent configuration: %w", id, err)
		}
	}
	return out, nil
}

// OpenAgent returns the agent configuration m was last built with, if kloud kept it.
func (f *Flow) OpenAgent(m *model.Machine) (userdata.Config, bool) {
	var c userdata.Config
	if len(m.AgentSealed) == 0 || m.KiteID == "" {
		return c, false
	}
	b, err := f.d.Store.Open(m.AgentSealed, agentAAD(m.ID))
	if err != nil {
		f.log.Warn("open a machine's agent configuration (it gets a new agent key)", "machine", m.ID, "err", err)
		return c, false
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, false
	}
	return c, true
}

// placeholderKey stands for an agent key in a preview's rendering (stack.plan of a stack): it
// has a kite key's shape and opens nothing. Terraform plans with it and applies nothing.
const placeholderKey = "eyJhbGciOiJub25lIn0.eyJwbGFjZWhvbGRlciI6dHJ1ZX0.cGxhbg"

// placeholderAgent is m's agent configuration in a preview: a placeholder key, nothing minted.
func (f *Flow) placeholderAgent(st *model.Stack, m *model.Machine) userdata.Config {
	src := f.d.Agents
	url := src.PublicURL
	if p, err := f.d.Providers.Lookup(m.Provider); err == nil {
		url = src.URL(p)
	}
	sum := src.KlientSum
	if sum == "" {
		sum = strings.Repeat("0", 64)
	}
	return userdata.Config{Username: st.Owner, KiteKey: placeholderKey, KontrolURL: url + "/kite", KlientURL: url + "/dl/klient", KlientSHA256: sum, CACert: src.CACert}
}
