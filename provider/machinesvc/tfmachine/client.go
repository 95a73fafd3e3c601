package tfmachine

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

// The HTTP JSON API of a machine service, under its API path (e.g. /provider/local/v1/) on
// kloud's HTTP server. Every request carries "Authorization: Bearer <token>", the token kloud
// minted for one stack build.
//
//	POST   path + "machines"            create request → 201 machine
//	GET    path + "machines/{id}"       → 200 machine, 404 when the machine does not exist
//	PUT    path + "machines/{id}/tags"  TagsRequest → 200 machine
//	DELETE path + "machines/{id}"       → 204 (also when it is already gone)
//
// Errors are ErrorBody.

// TagsRequest replaces a machine's tags.
type TagsRequest struct {
	Tags map[string]string `json:"tags"`
}

// ErrorBody is the body of every error answer.
type ErrorBody struct {
	Error string `json:"error"`
}

// Service describes a machine service to its client.
type Service struct {
	// Kind names the service in errors ("local": "kloud's local machine service").
	Kind string
	// APIPath is where kloud serves it ("/provider/local/v1/").
	APIPath string
	// Timeout bounds one request; a create boots the machine.
	Timeout time.Duration
	// NotFound is what Read's error wraps for a machine that does not exist.
	NotFound error
}

// Client calls a machine service: Req is its create request, M its machine.
type Client[Req, M any] struct {
	svc   Service
	base  *url.URL
	token string
	hc    *http.Client
}

// NewClient returns a client of the service at endpoint (kloud's URL: http or https, no query).
func NewClient[Req, M any](svc Service, endpoint, token string) (*Client[Req, M], error) {
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
	u.Path = strings.TrimSuffix(u.Path, "/") + svc.APIPath
	return &Client[Req, M]{svc: svc, base: u, token: token, hc: &http.Client{Timeout: svc.Timeout}}, nil
}

// Create creates a machine and returns it once the service made it.
func (c *Client[Req, M]) Create(ctx context.Context, req Req) (M, error) {
	var m M
	return m, c.do(ctx, http.MethodPost, "machines", req, &m)
}

// Read returns the machine, or an error wrapping Service.NotFound.
func (c *Client[Req, M]) Read(ctx context.Context, id string) (M, error) {
	var m M
	return m, c.do(ctx, http.MethodGet, "machines/"+id, nil, &m)
}

// SetTags replaces the machine's tags.
func (c *Client[Req, M]) SetTags(ctx context.Context, id string, tags map[string]string) (M, error) {
	var m M
	return m, c.do(ctx, http.MethodPut, "machines/"+id+"/tags", TagsRequest{Tags: tags}, &m)
}

// Delete destroys the machine; one already gone is not an error.
func (c *Client[Req, M]) Delete(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "machines/"+id, nil, nil)
}

// retryFor is how long a request is retried while kloud refuses connections (it is restarting):
// a refused connection never reached kloud, so even a create is safe to send again.
const retryFor = time.Minute

// do1 sends req, again while the connection is refused, until retryFor has passed.
func (c *Client[Req, M]) do1(ctx context.Context, req *http.Request) (*http.Response, error) {
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

func (c *Client[Req, M]) do(ctx context.Context, method, rel string, in, out any) error {
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
	svc := "kloud's " + c.svc.Kind + " machine service"
	resp, err := c.do1(ctx, req)
	if err != nil {
		return fmt.Errorf("%s: %w", svc, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("%s: %s %s: %w", svc, method, rel, err)
	}
	if resp.StatusCode/100 != 2 {
		var e ErrorBody
		msg := strings.TrimSpace(string(b))
		if json.Unmarshal(b, &e) == nil && e.Error != "" {
			msg = e.Error
		}
		if resp.StatusCode == http.StatusNotFound && method == http.MethodGet {
			return fmt.Errorf("%w: %s", c.svc.NotFound, msg)
		}
		return fmt.Errorf("kloud refused %s %s (%s): %s", method, rel, resp.Status, msg)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("%s: %s %s: bad answer: %w", svc, method, rel, err)
		}
	}
	return nil
}
