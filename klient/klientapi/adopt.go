package klientapi

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// MethodAdopt hands a running machine to a new owner without a rebuild (a prebuilt stack's
// claim): klient checks the new agent key (an agent key of the same machine, from the same
// issuer, whose owner is AdoptParams.Owner), ends what runs as the old owner's account, renames
// that account (login, group, home /home/<owner>, its sudo rule) to the new owner's, forgets the
// old owner's shares, writes the key over its kite.key, answers, and restarts in place as the
// new owner's agent (the new kite id registers; kloud revokes the old key then). Called again
// with the key it already runs with, it answers at once (AdoptResult.Already). Only kloud may
// ask (on the connection klient dialed), and only a klient that takes its owner from its key
// (started without --owner).
const MethodAdopt = "klient.adopt"

// FeatureAdopt is in Info.Features of a klient that serves klient.adopt.
const FeatureAdopt = "adopt"

// AccountName is a kloud username that klient makes a machine account of (a shared user's own
// account, an owner's account renamed by klient.adopt): kloud restricts usernames to it, and
// useradd and usermod take it (no ':' or '/').
var AccountName = regexp.MustCompile(`^[a-z][a-z0-9-]{0,31}$`)

// AdoptParams are klient.adopt's parameters.
type AdoptParams struct {
	// Owner is the new owner: a kloud username, which becomes the owner's account name.
	Owner string `json:"owner"`
	// Key is the new agent key (kloud minted it for this machine and Owner).
	Key string `json:"key"`
}

// Validate implements kite.Validator.
func (p *AdoptParams) Validate() error {
	var errs []error
	if !AccountName.MatchString(p.Owner) {
		errs = append(errs, fmt.Errorf("owner %q: want a username of 1-32 of a-z, 0-9 and '-', starting with a letter", p.Owner))
	}
	if strings.Count(p.Key, ".") != 2 {
		errs = append(errs, errors.New("key: want an agent key (a compact JWT)"))
	}
	return errors.Join(errs...)
}

// AdoptResult is klient.adopt's answer.
type AdoptResult struct {
	OldOwner string `json:"oldOwner"`
	Owner    string `json:"owner"`
	KiteID   string `json:"kiteId"` // the new key's: the id klient registers with after its restart
	// Already: klient runs with this key already (an earlier call did it); nothing changed.
	Already bool `json:"already,omitempty"`
	// Account says what happened to the machine's owner account: "renamed", "already"
	// (the new owner's account is the one kloud's user data made, renamed before) or "none"
	// (the machine has no account of the old owner's: a klient on a host, or in a test root).
	Account string `json:"account"`
	// Ended is how many terminal sessions of the old owner's ended.
	Ended int `json:"ended"`
}
