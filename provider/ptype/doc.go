// Package ptype holds the value types of the provider contract that travel beyond a provider:
// a machine's State and the methods allowed in it, Capability, PortRule, Resource, the
// constraints vocabulary (Constraint, ValidateConstraints), provider.describe's Description and
// a template's typed Parameter.
// It imports only the standard library, so that a client (kloud/api, kloud/model) and the plugin
// protocol (provider/pluginapi) name them without linking package provider's schema compiler,
// template parser or user data (a test keeps it so). Package provider names every one of them
// too (ptype.go there); a provider uses those names.
//
// Start reading at State (state.go).
package ptype
