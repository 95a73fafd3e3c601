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

	"github.com/kloud-dev/kloud/provider"
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
	// Owners (machine id → owner) and Team bind the labels kloud_owner and kloud_team of the
	// containers the token creates: the firewall (firewall.go) trusts them to say whose a
	// container is. A token without Owners (made before they existed) binds neither.
	Owners map[string]string `json:"o,omitempty"`
	Team   string            `json:"t,omitempty"`
}

// TokenVar is the sensitive Terraform variable that holds the proxy's URL with the stack's token.
const TokenVar = "kloud_docker_host"

// stackToken is the token of a build of stack b: its machines, their owners and its team.
func (d *Docker) stackToken(b *provider.BaseStack) (string, error) {
	t := token{Stack: b.StackID, Machines: make([]string, 0, len(b.Machines)), Owners: map[string]string{}, Team: b.Team}
	for _, m := range b.Machines {
		t.Machines = append(t.Machines, m.ID)
		t.Owners[m.ID] = m.Owner
	}
	return d.sign(t)
}

// sign completes t (this instance, expiry in TokenTTL) and signs it.
func (d *Docker) sign(t token) (string, error) {
	key, err := d.serviceKey()
	if err != nil {
		return "", err
	}
	t.Instance, t.Expires = d.instance, time.Now().Add(d.opts.TokenTTL).Unix()
	b, err := json.Marshal(t)
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

// ownerLabels checks a create's kloud_owner and kloud_team labels against the token's.
func (t *token) ownerLabels(labels map[string]string) error {
	if t.Owners == nil {
		return nil
	}
	if labels[LabelOwner] != t.Owners[labels[LabelMachine]] || labels[LabelTeam] != t.Team {
		return fmt.Errorf("container create: labels %s and %s must name the machine's owner and the stack's team", LabelOwner, LabelTeam)
	}
	return nil
}
