// Package tfmachine is the Terraform side of a kloud machine service (package provider/machinesvc):
// the HTTP client of the service (Client, client.go), the Terraform provider whose block holds
// the service's endpoint and the build's token (NewProvider, provider.go), and the machine
// resource's operations (Resource, resource.go), shared by the kloudlocal and kloudvagrant
// providers (providers/local/tfprovider, providers/vagrant/tfprovider), which bring their own
// request, machine and model types and their schema.
//
// It imports only terraform-plugin-framework and the standard library: it is linked into the
// Terraform provider binaries, which run sandboxed and unprivileged.
package tfmachine
