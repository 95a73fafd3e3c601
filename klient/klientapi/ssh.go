package klientapi

import "errors"

// SSH (docs/protocol.md "SSH"): kloud asks a machine's klient to serve one SSH connection on a
// tunnel WebSocket that klient dials back to kloud's attach endpoint (as port.connect does,
// with its own one-time ticket); the tunnel's framing is package internal/tunnel's. klient is
// the SSH server (its host key is Info.SSHHostKey); the tunnel is already authenticated by
// kloud, so the SSH layer takes no password or key, and the session runs as the account
// klient's access list gives the token's user (the owner's for the owner and full shares, the
// user's own for a terminal share; a read-only share is refused).
//
//	ssh.connect {token, attach: {url, ticket}} → {account}
const MethodSSHConnect = "ssh.connect"

// FeatureSSH is in klient.info's features when klient serves ssh.connect.
const FeatureSSH = "ssh"

// SSHConnectParams are the params of ssh.connect.
type SSHConnectParams struct {
	Token  string `json:"token"`
	Attach Attach `json:"attach"`
}

// Validate implements kite.Validator.
func (p *SSHConnectParams) Validate() error {
	if p.Attach.URL == "" || p.Attach.Ticket == "" {
		return errors.New("attach.url and attach.ticket are required")
	}
	return nil
}

// SSHConnectResult is the result of ssh.connect: the machine account the connection's
// sessions run as (the SSH user name it accepts).
type SSHConnectResult struct {
	Account string `json:"account"`
}

// SSHHostKeyParams are the params of ssh.hostKey.
type SSHHostKeyParams struct {
	Token string `json:"token"`
}

// SSHHostKeyResult is the result of ssh.hostKey: the machine's SSH host key (one
// authorized_keys line, "ssh-ed25519 AAAA...") and the account the token's user's sessions
// run as.
type SSHHostKeyResult struct {
	HostKey string `json:"hostKey"`
	Account string `json:"account"`
}

// MethodSSHHostKey answers the machine's SSH host key and the account of the token's user
// (what `kloud config-ssh` writes in the user's known_hosts and ssh config).
//
//	ssh.hostKey {token} → {hostKey, account}
const MethodSSHHostKey = "ssh.hostKey"
