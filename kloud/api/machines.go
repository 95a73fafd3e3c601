package api

import (
	"errors"

	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/provider/ptype"
)

// MachineListParams filter machine.list.
type MachineListParams struct {
	StackID string `json:"stackId,omitempty"`
	Team    string `json:"team,omitempty"` // team admins: every machine of the team
}

// MachineListResult is the result of machine.list.
type MachineListResult struct {
	Machines []model.Machine `json:"machines"`
	// StackTitles are the titles of the machines' stacks by stack id, for showing which stack a
	// machine belongs to.
	StackTitles map[string]string `json:"stackTitles,omitempty"`
}

// MachineInfo is machine.info's result: the stored machine reconciled with the provider.
type MachineInfo struct {
	model.Machine
	StackTitle string      `json:"stackTitle,omitempty"` // the title of the machine's stack
	InfraState ptype.State `json:"infraState"`
	InfoError  string      `json:"infoError,omitempty"`
}

// ShareParams are the params of machine.share and machine.unshare.
type ShareParams struct {
	MachineID string `json:"machineId"`
	Username  string `json:"username"`
	Grant     string `json:"grant,omitempty"` // share only: readonly, terminal or full
}

// Validate implements kite.Validator.
func (p *ShareParams) Validate() error {
	if p.MachineID == "" || p.Username == "" {
		return errors.New("machineId and username are required")
	}
	return nil
}

// SharesResult lists a machine's shares.
type SharesResult struct {
	MachineID string        `json:"machineId"`
	Shares    []model.Share `json:"shares"`
	// Pushed says whether the machine's agent has the new list (false: it gets it when it
	// connects next).
	Pushed bool `json:"pushed"`
}
