package tfprovider

import (
	"errors"
	"time"

	"github.com/kloud-dev/kloud/provider/machinesvc/tfmachine"
)

// The vagrant machine service's HTTP JSON API, which kloud's vagrant provider serves (package
// providers/vagrant, service.go) and this provider calls. Every request carries
// "Authorization: Bearer <token>", the token kloud minted for one stack build.
//
//	POST   APIPath + "machines"            CreateRequest → 201 Machine (created and booted)
//	GET    APIPath + "machines/{id}"       → 200 Machine, 404 when the machine does not exist
//	PUT    APIPath + "machines/{id}/tags"  TagsRequest → 200 Machine
//	DELETE APIPath + "machines/{id}"       → 204 (also when it is already gone)
//
// Errors are {"error": "..."}: 400 invalid input, 401 no or bad token, 403 not this stack's
// machine, 404 unknown machine, 502 the owner's vagrant host failed, 503 the owner has no vagrant
// host connected.
const APIPath = "/provider/vagrant/v1/"

// CreateRequest is a machine to create on the stack owner's vagrant host. Exactly one of Image
// (a Docker image: Vagrant's docker provider) and Box (a Vagrant box) is set. Tags must hold
// kloud's kloud_stack and kloud_machine.
type CreateRequest struct {
	Hostname string `json:"hostname"`
	Image    string `json:"image,omitempty"`
	Box      string `json:"box,omitempty"`
	// Provider is the Vagrant provider (default docker for an image, Vagrant's default for a box).
	Provider string            `json:"provider,omitempty"`
	UserData string            `json:"userData,omitempty"`
	MemoryMB int64             `json:"memoryMB,omitempty"`
	CPUs     int64             `json:"cpus,omitempty"`
	Tags     map[string]string `json:"tags"`
}

// TagsRequest replaces a machine's tags.
type TagsRequest = tfmachine.TagsRequest

// Machine is a machine as the service reports it.
type Machine struct {
	ID       string            `json:"id"`   // the Vagrant machine's name on the host
	Host     string            `json:"host"` // the vagrant host klient's kite id
	Hostname string            `json:"hostname"`
	State    string            `json:"state"` // "running", "stopped", "notCreated", "unknown"
	Image    string            `json:"image,omitempty"`
	Box      string            `json:"box,omitempty"`
	Provider string            `json:"provider,omitempty"`
	MemoryMB int64             `json:"memoryMB,omitempty"`
	CPUs     int64             `json:"cpus,omitempty"`
	Tags     map[string]string `json:"tags,omitempty"`
}

// ErrorBody is the body of every error answer.
type ErrorBody = tfmachine.ErrorBody

// ErrNotFound is returned by Client.Read for a machine that does not exist.
var ErrNotFound = errors.New("kloudvagrant: machine not found")

// Client calls the vagrant machine service (tfmachine.Client).
type Client = tfmachine.Client[CreateRequest, Machine]

// service is the vagrant machine service as its client sees it. A create boots the machine
// through Vagrant (a minute or two); nothing else takes long.
var service = tfmachine.Service{Kind: "vagrant", APIPath: APIPath, Timeout: 15 * time.Minute, NotFound: ErrNotFound}

// NewClient returns a client of the service at endpoint (kloud's URL: http or https, no query).
func NewClient(endpoint, token string) (*Client, error) {
	return tfmachine.NewClient[CreateRequest, Machine](service, endpoint, token)
}
