// Package stackbuild holds the parts of a stack build that are neither the provider contract
// nor kloud's RPC surface. Today that is the Planner (planner.go): after Terraform created the
// machines it waits for each machine's agent to register with kontrol, answer kite.ping and
// finish provisioning, and when an agent never comes it names the provisioning step that failed
// (ParseBootFailure reads a machine's console for that).
//
// It was moved here from provider/ so that the provider contract links neither kite nor klient
// (a test in provider/ enforces that): kloud passes the planner an Agents implementation over
// its kontrol.
package stackbuild
