package stackbuild

import "github.com/kloud-dev/kloud/provider"

// Stage is one named step of a stack or machine job, as its progress shows it: the message
// users see, the percentage the step starts at (Percent) and the state named as the job's stage
// (State). Every job of the build flow reports its progress through these constants, so the
// figures live here and nowhere else.
type Stage string

// Stages of stack.apply building a stack.
const (
	BuildChecking    Stage = "Checking machines"                   // 10%: machines set Building
	BuildCredentials Stage = "Fetching and validating credentials" // 20%: template built, policy checked
	BuildUserData    Stage = "Preparing the agents' user data"     // 30%: keys minted, user data rendered, template rewritten
	BuildBuckets     Stage = "Provisioning buckets"                // 35%: the template's kloud_bucket claims (buckets.go)
	BuildResources   Stage = "Building stack resources"            // 40–70%: terraform apply (Within)
	BuildAgents      Stage = "Checking machines' agents"           // 70%: the Planner waits for agents
	BuildSettings    Stage = "Updating machine settings"           // 90%: states and attributes written
	BuildDone        Stage = "Stack building finished"             // 100%
)

// Stages of stack.apply destroying a stack.
const (
	DestroyMachines  Stage = "Destroying machines"         // 10%: machines set Terminating
	DestroyResources Stage = "Destroying stack resources"  // 30–90%: terraform destroy (Within)
	DestroyKeys      Stage = "Revoking the machines' keys" // 90%
	DestroyBuckets   Stage = "Deleting buckets"            // 95%: the stack's bucket claims (buckets.go)
	DestroyDone      Stage = "Stack destroyed"             // 100%
)

// Stages of machine.start and machine.stop.
const (
	MachineStarting Stage = "Starting machine"             // 25%
	MachineStopping Stage = "Stopping machine"             // 25%
	MachineAgent    Stage = "Checking the machine's agent" // 75%: after a start, the Planner waits
	MachineStarted  Stage = "Machine started"              // 100%
	MachineStopped  Stage = "Machine stopped"              // 100%
)

// Percent is the job's progress when the stage begins.
func (s Stage) Percent() int {
	switch s {
	case BuildChecking, DestroyMachines:
		return 10
	case BuildCredentials:
		return 20
	case BuildUserData, DestroyResources:
		return 30
	case BuildBuckets:
		return 35
	case BuildResources:
		return 40
	case BuildAgents:
		return 70
	case BuildSettings, DestroyKeys:
		return 90
	case DestroyBuckets:
		return 95
	case MachineStarting, MachineStopping:
		return 25
	case MachineAgent:
		return 75
	case BuildDone, DestroyDone, MachineStarted, MachineStopped:
		return 100
	}
	return 0
}

// Within is the progress at pct percent (0–100) through a stage that spans up to the next
// stage (terraform's own progress during BuildResources and DestroyResources).
func (s Stage) Within(pct int) int {
	end := s.Percent()
	switch s {
	case BuildResources:
		end = BuildAgents.Percent()
	case DestroyResources:
		end = DestroyKeys.Percent()
	}
	pct = min(max(pct, 0), 100)
	return s.Percent() + pct*(end-s.Percent())/100
}

// State is the state a job names as its stage while in s: the transitional state of its
// machines, and the settled state once it is done.
func (s Stage) State() provider.State {
	switch s {
	case BuildDone:
		return provider.Running
	case DestroyMachines, DestroyResources, DestroyKeys, DestroyBuckets:
		return provider.Terminating
	case DestroyDone:
		return provider.Terminated
	case MachineStarting, MachineAgent:
		return provider.Starting
	case MachineStopping:
		return provider.Stopping
	case MachineStarted:
		return provider.Running
	case MachineStopped:
		return provider.Stopped
	}
	return provider.Building
}
