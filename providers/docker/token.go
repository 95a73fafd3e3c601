package docker

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// A service token authorizes one stack's terraform runs on the Docker API proxy: it names the
// stack, the kloud machine ids whose containers it may create, this kloud's instance and when
// creating ends. It is base64url(JSON) "." base64url(HMAC-SHA256), keyed by the provider's
// service key (<StateDir>/.service-key, 0600), and travels in the proxy's URL path (the
// generated provider block's host, from a sensitive variable).
type token struct {
	Stack    string   `json:"s"`
	Machines []string `json:"m,omitempty"`
	Instance string   `json:"i"`
	Expires  int64    `json:"e"`
}

// TokenVar is the sensitive Terraform variable that holds the proxy's URL with the stack's token.
const TokenVar = "kloud_docker_host"

func (d *Docker) mintToken(stack string, machines []string) (string, error) {
	key, err := d.serviceKey()
	if err != nil {
		return "", err
	}
	b, err := json.Marshal(token{Stack: stack, Machines: machines, Instance: d.instance, Expires: time.Now().Add(d.opts.TokenTTL).Unix()})
	if err != nil {
		return "", err
	}
	p := base64.RawURLEncoding.EncodeToString(b)
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(p))
	return p + "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil)), nil
}

var errToken = errors.New("invalid docker service token")

// parseToken checks the token's signature and instance. Expiry is the caller's to check: an
// expired token still reads and destroys its stack's containers (a destroy reuses the last
// build's variables), never creates.
func (d *Docker) parseToken(s string) (*token, error) {
	key, err := d.serviceKey()
	if err != nil {
		return nil, err
	}
	p, sig, ok := strings.Cut(s, ".")
	if !ok || len(s) > 8<<10 {
		return nil, errToken
	}
	got, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil {
		return nil, errToken
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(p))
	if !hmac.Equal(got, mac.Sum(nil)) {
		return nil, errToken
	}
	b, err := base64.RawURLEncoding.DecodeString(p)
	if err != nil {
		return nil, errToken
	}
	var t token
	if err := json.Unmarshal(b, &t); err != nil || t.Stack == "" {
		return nil, errToken
	}
	if t.Instance != d.instance {
		return nil, fmt.Errorf("%w: made by another kloud instance", errToken)
	}
	return &t, nil
}

func (t *token) expired() bool { return time.Now().Unix() > t.Expires }

func (t *token) mayCreate(machine string) bool {
	return !t.expired() && slices.Contains(t.Machines, machine)
}
