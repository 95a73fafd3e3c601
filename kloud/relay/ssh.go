package relay

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/kloud-dev/kloud/internal/tunnel"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/klient/klientapi"
	"github.com/kloud-dev/kloud/kloud/kloudhttp"
	"github.com/kloud-dev/kloud/kloud/model"
)

// SSH through kloud (docs/protocol.md "SSH"). The machine's klient is the SSH server; the SSH
// bytes ride a tunnel like a port forward's (kloud calls ssh.connect with a one-time ticket,
// klient dials the attach endpoint back), so the machine needs no inbound port:
//
//	GET /api/machines/{id}/ssh          WebSocket: one SSH connection (`kloud ssh --stdio`)
//	GET /api/machines/{id}/ssh/hostkey  {machineId, label, hostKey, account} (`kloud config-ssh`)
//
// Who: as a terminal that types, the owner and terminal or full shares (klient checks its own
// access list too and picks the account); a read-only share is refused. Audited like a
// terminal: ssh.open for every attempt of a known user, ssh.close with the duration and bytes.

// The audit log's actions of SSH connections.
const (
	ActionSSHOpen  = "ssh.open"
	ActionSSHClose = "ssh.close"
)

// maySSH says whether user may open SSH connections to m: its owner, a terminal or full share.
func maySSH(user string, m *model.Machine) error {
	switch Role(user, m) {
	case "owner", model.GrantTerminal, model.GrantFull:
		return nil
	case model.GrantReadonly:
		return fmt.Errorf("machine %s is shared with %s read-only: SSH needs a terminal or full share (a read-only share only watches terminals): %w", m.Label, user, kite.ErrPermission)
	}
	return fmt.Errorf("machine %s is not shared with %s: only its owner and users it is shared with (terminal or full) reach it over SSH: %w", m.Label, user, kite.ErrPermission)
}

// SSHHostKey is the answer of GET /api/machines/{id}/ssh/hostkey.
type SSHHostKey struct {
	MachineID string `json:"machineId"`
	Label     string `json:"label"`
	HostKey   string `json:"hostKey"` // one authorized_keys line: "ssh-ed25519 AAAA..."
	Account   string `json:"account"` // the SSH user name: the account the user's sessions run as
}

// agentErr explains an agent's error for SSH.
func agentErr(m *model.Machine, err error) error {
	if errors.Is(err, kite.ErrMethodNotFound) {
		return fmt.Errorf("the agent of machine %s predates SSH: restart the machine to update it: %w", m.Label, kite.ErrState)
	}
	return fmt.Errorf("ssh to machine %s: %w", m.Label, err)
}

// ServeSSHHostKey is GET /api/machines/{id}/ssh/hostkey: the machine's SSH host key, as its
// klient reports it over the agent's authenticated connection (kept on the machine's record,
// Options.KeepHostKey), and the caller's account. While the agent is not connected it answers
// the key klient reported last, and the account the grant gives.
func (h *Hub) ServeSSHHostKey(w http.ResponseWriter, r *http.Request) {
	user, m, err := h.target(r, maySSH)
	if err != nil {
		writeErr(w, err)
		return
	}
	var res klientapi.SSHHostKeyResult
	err = h.agentCall(r.Context(), user, m, klientapi.MethodSSHHostKey, func(tok string) any { return klientapi.SSHHostKeyParams{Token: tok} }, &res)
	switch {
	case err == nil && res.HostKey != m.SSHHostKey && h.o.KeepHostKey != nil:
		if kerr := h.o.KeepHostKey(r.Context(), m.ID, res.HostKey); kerr != nil {
			h.log.WarnContext(r.Context(), "keep the machine's ssh host key", "machine", m.ID, "err", kerr)
		}
	case err != nil && m.SSHHostKey != "" && !errors.Is(err, kite.ErrPermission) && !errors.Is(err, kite.ErrAuth):
		// The agent is away (a stopped machine): what it reported last.
		res = klientapi.SSHHostKeyResult{HostKey: m.SSHHostKey, Account: m.Owner}
		if Role(user, m) == model.GrantTerminal {
			res.Account = user // a terminal share's own account (klient's webterm.SharedAccountName)
		}
		err = nil
	}
	if err != nil {
		writeErr(w, agentErr(m, err))
		return
	}
	kloudhttp.WriteJSON(w, http.StatusOK, SSHHostKey{MachineID: m.ID, Label: m.Label, HostKey: res.HostKey, Account: res.Account})
}

// ServeSSH is GET /api/machines/{id}/ssh: a `kloud ssh --stdio` connection, a WebSocket tunnel
// to an SSH connection served by the machine's klient.
func (h *Hub) ServeSSH(w http.ResponseWriter, r *http.Request) {
	h.serveTunnel(w, r, tunnelKind{allowed: maySSH, target: "machine/" + r.PathValue("id"), open: ActionSSHOpen, close: ActionSSHClose,
		what: "SSH", dial: func(ctx context.Context, user string, m *model.Machine) (*tunnel.Conn, error) {
			t, err := h.dialBack(ctx, user, m, klientapi.MethodSSHConnect, m.Label+":ssh", func(tok string, a klientapi.Attach) any {
				return klientapi.SSHConnectParams{Token: tok, Attach: a}
			})
			if err != nil {
				return nil, agentErr(m, err)
			}
			return t, nil
		}})
}
