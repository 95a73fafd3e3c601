package tfprovider

import (
	"errors"
	"time"

	"github.com/kloud-dev/kloud/provider/machinesvc/tfmachine"
)

// The local machine service's HTTP JSON API, which kloud's local provider serves (package
// providers/local, service.go) and this provider calls. Every request carries
// "Authorization: Bearer <token>", the token kloud minted for one stack build.
//
//	POST   APIPath + "machines"            CreateRequest → 201 Machine
//	GET    APIPath + "machines/{id}"       → 200 Machine, 404 when the machine does not exist
//	PUT    APIPath + "machines/{id}/tags"  TagsRequest → 200 Machine
//	DELETE APIPath + "machines/{id}"       → 204 (also when it is already gone)
//
// Errors are {"error": "..."}: 400 invalid input, 401 no or bad token, 403 not this stack's
// machine, 404 unknown machine, 500 the machine library failed.
const APIPath = "/provider/local/v1/"

// CreateRequest is a machine to create. Tags must hold kloud's kloud_stack and kloud_machine.
type CreateRequest struct {
	Hostname string            `json:"hostname"`
	UserData string            `json:"userData,omitempty"`
	MemoryMB int64             `json:"memoryMB,omitempty"`
	CPUs     float64           `json:"cpus,omitempty"`
	DiskMB   int64             `json:"diskMB,omitempty"` // disk quota of the writable layer; 0: none
	Tags     map[string]string `json:"tags"`
}

// TagsRequest replaces a machine's tags.
type TagsRequest = tfmachine.TagsRequest

// Machine is a machine as the service reports it.
type Machine struct {
	ID        string            `json:"id"`
	Hostname  string            `json:"hostname"`
	State     string            `json:"state"` // "running" or "stopped"
	IPAddress string            `json:"ipAddress"`
	MemoryMB  int64             `json:"memoryMB,omitempty"`
	CPUs      float64           `json:"cpus,omitempty"`
	DiskMB    int64             `json:"diskMB,omitempty"`
	Tags      map[string]string `json:"tags,omitempty"`
}

// ErrorBody is the body of every error answer.
type ErrorBody = tfmachine.ErrorBody

// ErrNotFound is returned by Client.Read for a machine that does not exist.
var ErrNotFound = errors.New("kloudlocal: machine not found")

// Client calls the local machine service (tfmachine.Client).
type Client = tfmachine.Client[CreateRequest, Machine]

// service is the local machine service as its client sees it. A create boots the machine (a
// minute at most); nothing else takes long.
var service = tfmachine.Service{Kind: "local", APIPath: APIPath, Timeout: 5 * time.Minute, NotFound: ErrNotFound}

// NewClient returns a client of the service at endpoint (kloud's URL: http or https, no query).
func NewClient(endpoint, token string) (*Client, error) {
	return tfmachine.NewClient[CreateRequest, Machine](service, endpoint, token)
}
