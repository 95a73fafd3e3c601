// Package relay is how users reach a machine through kloud, never by a route to the machine:
// the browser terminal (and `kloud ssh`), `kloud port-forward`'s tunnels, and machines' web apps
// on their own origins. kloud authorises the user for the machine, asks the machine's klient
// (over its agent connection, klient/klientapi's methods) to dial back to kloud's attach
// endpoint with a one-time ticket, and relays the two connections.
//
// Start reading at [New] and [Options]: the relay gets what it needs of kloud through small
// interfaces (Access: who calls and which machine; Agents: a machine's klient; Tokens: the
// tokens klient and app cookies carry; Auditor: the audit log), never kloud's Server, and it
// does not import package kloud (a test keeps it so). Then terminal.go (the terminal endpoints
// and the frame relay), ports.go (port forwarding's tunnels) and apps.go (web apps on their own
// hosts). kloud mounts the handlers in its route table (kloud/routes.go) and sends app hosts'
// requests here before its own routes ([Hub.ServeApp]). The wire side is docs/protocol.md
// "Web terminal" and "Port forwarding".
package relay
