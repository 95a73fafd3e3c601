package api

// UpgradeAgentResult is machine.upgradeAgent's result: the agent's klient before and after.
type UpgradeAgentResult struct {
	MachineID  string `json:"machineId"`
	Label      string `json:"label"`
	OldVersion string `json:"oldVersion"`
	NewVersion string `json:"newVersion"`
	OldSHA256  string `json:"oldSha256"`
	NewSHA256  string `json:"newSha256"`
	// Upgraded is false when the agent already ran the klient kloud serves (nothing was done).
	Upgraded bool `json:"upgraded"`
	// Sessions is how many terminal sessions the agent kept across its restart.
	Sessions int `json:"sessions"`
}

// Agent rollout modes (kloud serve --agent-rollout).
const (
	// AgentRolloutAuto upgrades every agent that registers with a klient other than the one
	// kloud serves (machine.upgradeAgent's work, a few at a time).
	AgentRolloutAuto = "auto"
	// AgentRolloutOff leaves agents as they are: machine.upgradeAgent upgrades one.
	AgentRolloutOff = "off"
)
