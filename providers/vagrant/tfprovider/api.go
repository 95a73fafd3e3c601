package tfprovider

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"time"
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
type TagsRequest struct {
	Tags map[string]string `json:"tags"`
}

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
type ErrorBody struct {
	Error string `json:"error"`
}

// ErrNotFound is returned by Client.Read for a machine that does not exist.
var ErrNotFound = errors.New("kloudvagrant: machine not found")

// Client calls the vagrant machine service.
type Client struct {
	base  *url.URL
	token string
	hc    *http.Client
}

// NewClient returns a client of the service at endpoint (kloud's URL: http or https, no query).
func NewClient(endpoint, token string) (*Client, error) {
	u, err := url.Parse(endpoint)
	if err != nil {
		return nil, fmt.Errorf("endpoint %q: %w", endpoint, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return nil, fmt.Errorf("endpoint %q: want http(s)://host:port of kloud, without query or credentials", endpoint)
	}
	if token == "" {
		return nil, errors.New("token is empty")
	}
	u.Path = strings.TrimSuffix(u.Path, "/") + APIPath
	// A create boots the machine through Vagrant (a minute or two); nothing else takes long.
	return &Client{base: u, token: token, hc: &http.Client{Timeout: 15 * time.Minute}}, nil
}

// Create creates a machine on the owner's vagrant host and boots it (vagrant up).
func (c *Client) Create(ctx context.Context, req CreateRequest) (Machine, error) {
	var m Machine
	return m, c.do(ctx, http.MethodPost, "machines", req, &m)
}

// Read returns the machine, or ErrNotFound.
func (c *Client) Read(ctx context.Context, id string) (Machine, error) {
	var m Machine
	return m, c.do(ctx, http.MethodGet, "machines/"+id, nil, &m)
}

// SetTags replaces the machine's tags.
func (c *Client) SetTags(ctx context.Context, id string, tags map[string]string) (Machine, error) {
	var m Machine
	return m, c.do(ctx, http.MethodPut, "machines/"+id+"/tags", TagsRequest{Tags: tags}, &m)
}

// Delete destroys the machine; one already gone is not an error.
func (c *Client) Delete(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "machines/"+id, nil, nil)
}

// retryFor is how long a request is retried while kloud refuses connections (it is restarting):
// a refused connection never reached kloud, so even a create is safe to send again.
const retryFor = time.Minute

// do1 sends req, again while the connection is refused, until retryFor has passed.
func (c *Client) do1(ctx context.Context, req *http.Request) (*http.Response, error) {
	deadline := time.Now().Add(retryFor)
	delay := 250 * time.Millisecond
	for {
		if req.GetBody != nil {
			body, err := req.GetBody()
			if err != nil {
				return nil, err
			}
			req.Body = body
		}
		resp, err := c.hc.Do(req)
		if err == nil || !errors.Is(err, syscall.ECONNREFUSED) || time.Now().Add(delay).After(deadline) {
			return resp, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(delay):
		}
		delay = min(2*delay, 5*time.Second)
	}
}

func (c *Client) do(ctx context.Context, method, rel string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	u := c.base.JoinPath(rel)
	req, err := http.NewRequestWithContext(ctx, method, u.String(), body)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.do1(ctx, req)
	if err != nil {
		return fmt.Errorf("kloud's vagrant machine service: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("kloud's vagrant machine service: %s %s: %w", method, rel, err)
	}
	if resp.StatusCode/100 != 2 {
		var e ErrorBody
		msg := strings.TrimSpace(string(b))
		if json.Unmarshal(b, &e) == nil && e.Error != "" {
			msg = e.Error
		}
		if resp.StatusCode == http.StatusNotFound && method == http.MethodGet {
			return fmt.Errorf("%w: %s", ErrNotFound, msg)
		}
		return fmt.Errorf("kloud refused %s %s (%s): %s", method, rel, resp.Status, msg)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("kloud's vagrant machine service: %s %s: bad answer: %w", method, rel, err)
		}
	}
	return nil
}
