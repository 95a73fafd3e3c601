// Package machinesvc is the shared machinery of providers whose machines kloud makes itself, on
// behalf of an unprivileged Terraform provider: "a machine service behind a per-build token,
// plus a Terraform resource that calls it". The local provider (kloudlocal: namespace machines
// on kloud's host) and the vagrant provider (kloudvagrant: machines on the owner's vagrant host)
// are built this way.
//
// Start with Template (template.go): what a provider's Stack.ApplyTemplate does with such a
// template (user data, tags, the generated provider block with the endpoint and the build's
// token, see package provider/buildtoken). The Terraform side (the HTTP client of the service,
// the provider's skeleton) is package tfmachine, which stays free of kloud's own packages so the
// Terraform provider binaries stay small.
package machinesvc
