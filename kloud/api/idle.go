package api

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kloud-dev/kloud/kloud/model"
)

// Idle stop (kloud/idle.go, issue 19 §5): a Running machine nobody uses is stopped after its idle
// timeout, unless it is always on. A machine's settings come from machine.set, else from its
// stack's template (template.update idleTimeout, alwaysOn), else from kloud (serve
// --idle-timeout).

// MethodMachineSet changes a machine's own settings (its idle stop).
const MethodMachineSet = "machine.set"

// MaxIdleTimeout is the longest idle timeout kloud takes (longer: say always on, or 0).
const MaxIdleTimeout = 366 * 24 * time.Hour

// IdleTimeoutDefault is the idleTimeout that drops a machine's (or a template's) own timeout:
// it inherits again.
const IdleTimeoutDefault = "default"

// ParseIdleTimeout parses an idleTimeout param: a Go duration of whole seconds ("30m", "1h30m")
// or "0" (never); "" and IdleTimeoutDefault give nil (inherit).
func ParseIdleTimeout(v string) (*int64, error) {
	if v == "" || v == IdleTimeoutDefault {
		return nil, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return nil, fmt.Errorf("idleTimeout %q: want a duration such as 30m or 1h, 0 for never, or %q: %w", v, IdleTimeoutDefault, err)
	}
	if d < 0 || d > MaxIdleTimeout || d%time.Second != 0 || d > 0 && d < time.Second {
		return nil, fmt.Errorf("idleTimeout %q: want whole seconds from 1s to %s, or 0 for never", v, MaxIdleTimeout)
	}
	n := int64(d / time.Second)
	return &n, nil
}

// MachineSetParams are the params of machine.set (the machine's owner, team admins). A field
// left out is left as it is.
type MachineSetParams struct {
	MachineID string `json:"machineId"`
	// IdleTimeout: a duration ("30m"), "0" (never stopped for being idle) or "default" (the
	// template's, else kloud's).
	IdleTimeout string `json:"idleTimeout,omitempty"`
	// AlwaysOn: never stopped for being idle; false undoes a template's always on for this
	// machine. ResetAlwaysOn drops the machine's own choice (the template's again).
	AlwaysOn      *bool `json:"alwaysOn,omitempty"`
	ResetAlwaysOn bool  `json:"resetAlwaysOn,omitempty"`
	// Autostart starts the machine, if it is Stopped, on a schedule: "mon-fri 09:00" (see
	// ParseSchedule) in Timezone (an IANA zone, default UTC); "off" drops it.
	Autostart string `json:"autostart,omitempty"`
	Timezone  string `json:"timezone,omitempty"`
}

// Validate implements kite.Validator.
func (p *MachineSetParams) Validate() error {
	if err := required("machineId", p.MachineID); err != nil {
		return err
	}
	if p.IdleTimeout == "" && p.AlwaysOn == nil && !p.ResetAlwaysOn && p.Autostart == "" {
		return errors.New("say what to set: idleTimeout, alwaysOn or autostart")
	}
	if p.Timezone != "" && (p.Autostart == "" || p.Autostart == AutostartOff) {
		return errors.New("timezone goes with an autostart schedule")
	}
	if p.Autostart != "" && p.Autostart != AutostartOff {
		if _, _, err := ParseAutostart(p.Autostart, p.Timezone); err != nil {
			return err
		}
	}
	if p.AlwaysOn != nil && p.ResetAlwaysOn {
		return errors.New("alwaysOn and resetAlwaysOn exclude each other")
	}
	_, err := ParseIdleTimeout(p.IdleTimeout)
	return err
}

// MachineSet changes a machine's own settings; it returns the machine.
func (c *Client) MachineSet(ctx context.Context, p MachineSetParams) (model.Machine, error) {
	return RPCMachineSet.Call(ctx, c.c, p)
}
