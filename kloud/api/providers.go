package api

import (
	"fmt"
	"strings"
	"time"

	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/provider/pluginapi"
)

// Provider plugins (provider/plugin, kloud/plugins.go) and the provider list.

// PluginRegisterParams are the params of plugin.register, which only a provider plugin calls
// (with its plugin key): the plugin API versions it speaks, its own version and its manifest.
// Package provider/pluginapi defines them (pluginapi.RegisterParams); provider/plugin makes the call.
type PluginRegisterParams pluginapi.RegisterParams

// Kinds of provider in provider.list.
const (
	ProviderBuiltin = "builtin" // compiled into kloud, runs in its process
	ProviderPlugin  = "plugin"  // out of process, over kite (launched by kloud, or remote)
)

// ProviderListResult is the result of provider.list.
type ProviderListResult struct {
	Providers []ProviderStatus `json:"providers"`
}

// ProviderStatus is one provider in provider.list.
type ProviderStatus struct {
	Name string `json:"name"`
	Kind string `json:"kind"` // ProviderBuiltin or ProviderPlugin
	// Version is a plugin's own version ("" for a builtin) and APIVersion the plugin API version
	// kloud and the plugin agreed on.
	Version    string `json:"version,omitempty"`
	APIVersion int    `json:"apiVersion,omitempty"`
	// Where it runs: "in process", "launched (pid N, sandboxed as uid 65534)", "remote ADDR", ...
	Where string `json:"where"`
	// Connected: a plugin has a live connection (a builtin: it is available on this host).
	Connected bool `json:"connected"`
	// Replica: with several kloud replicas, the one holding a plugin's connection when it is
	// not the one answering (its calls are forwarded there). Shown to administrators.
	Replica        string     `json:"replica,omitempty"`
	ConnectedAt    *time.Time `json:"connectedAt,omitempty"`
	DisconnectedAt *time.Time `json:"disconnectedAt,omitempty"`
	Capabilities   []string   `json:"capabilities"`
	// LastError: why a plugin is not connected, exited or was refused (or why a builtin is
	// unavailable).
	LastError string `json:"lastError,omitempty"`
}

// ProviderKeyCreateParams are the params of provider.keyCreate (kloud administrators): mint the
// plugin key a remote plugin of provider Provider dials kloud with.
type ProviderKeyCreateParams struct {
	Provider string `json:"provider"`
	KiteID   string `json:"kiteId,omitempty"` // default: a new one (kitekey.PluginIDPrefix…)
}

// Validate implements kite.Validator.
func (p *ProviderKeyCreateParams) Validate() error {
	if err := kitekey.ValidProviderName(p.Provider); err != nil {
		return err
	}
	if p.KiteID != "" && !strings.HasPrefix(p.KiteID, kitekey.PluginIDPrefix) {
		return fmt.Errorf("kiteId %q must start with %q", p.KiteID, kitekey.PluginIDPrefix)
	}
	return nil
}

// ProviderKeyCreateResult is the result of provider.keyCreate: the key (a secret: give it to
// the plugin, e.g. as the file of KLOUD_PLUGIN_KEY_FILE) and its kite id, by which
// kontrol.revoke revokes it.
type ProviderKeyCreateResult struct {
	Provider string `json:"provider"`
	KiteID   string `json:"kiteId"`
	Key      string `json:"key"`
}
