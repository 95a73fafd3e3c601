package userdata

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
)

// ErrInvalid is wrapped by every error about a bad Config or user data that cannot be used.
var ErrInvalid = errors.New("invalid user data config")

// OwnerGecos is the GECOS field of the owner's account the user data creates: klient renames
// only such an account when a machine changes hands (klient.adopt).
const OwnerGecos = "Kloud machine owner"

// Config is what kloud knows about one machine when it renders its cloud-init user data.
type Config struct {
	// Username is the machine owner, created in the machine with bash, a locked password and
	// passwordless sudo. Required; Debian user name syntax, at most 32 characters, not a system
	// account such as root.
	Username string
	// Hostname is set by cloud-init; empty leaves the datasource's local-hostname. RFC 1123 syntax;
	// a name with dots is taken as the FQDN (cloud-init uses its first label as the hostname).
	Hostname string
	// KiteKey is the agent key minted for this machine (kind agentKey, sub "machine:<id>"; its
	// jti is the kite id kloud waits for). Required; written as is to /etc/kloud/kite.key, mode
	// 0400 root:root: only root on the machine (the owner, and full shares, via sudo) can read
	// it, and it is good for nothing but registering this machine's agent.
	KiteKey string
	// KontrolURL is passed to klient, e.g. http://10.200.0.1:7000/kite. Required, http or https.
	KontrolURL string
	// KlientURL is where provision.sh downloads klient, e.g. http://10.200.0.1:7000/dl/klient.
	// Required, http or https. Redirects are not followed.
	KlientURL string
	// KlientSHA256 is the hex sha256 of the klient binary served at KlientURL. Required.
	KlientSHA256 string
	// CACert is the PEM of a CA to trust beside the machine's own roots when reaching kloud
	// (a kloud with TLS whose certificate no public CA signed; kloud serve --ca-cert). Written to
	// /etc/kloud/ca.pem (0644); the klient download uses it (curl --cacert) and klient gets
	// --ca-cert. Empty: the machine's system roots only.
	CACert string
	// UserData is the template author's user_data: "", a script, or "#cloud-config\n..." (merged).
	// See the package doc for what else is rejected.
	UserData string
	// Extra holds cloud-config keys a provider wants (e.g. "locale": "C.UTF-8"), merged into
	// kloud's config before the user's, with the same rules. Values may be any Go values that
	// marshal as YAML maps, lists and scalars (map[string]T, []T, string, bool, numbers).
	Extra map[string]any
}

var (
	// Debian's adduser NAME_REGEX (without the optional trailing "$" of machine accounts).
	usernameRe = regexp.MustCompile(`^[a-z_][a-z0-9_-]*$`)
	labelRe    = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?$`)
	jwtRe      = regexp.MustCompile(`^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*$`)
	sha256Re   = regexp.MustCompile(`^[0-9a-fA-F]{64}$`)
)

// systemUsers are accounts a Debian or Ubuntu image already has (or cloud-init manages), so an
// owner by that name would alter them instead of creating a user.
var systemUsers = map[string]bool{
	"root": true, "daemon": true, "bin": true, "sys": true, "sync": true, "games": true,
	"man": true, "lp": true, "mail": true, "news": true, "uucp": true, "proxy": true,
	"www-data": true, "backup": true, "list": true, "irc": true, "gnats": true, "nobody": true,
	"_apt": true, "messagebus": true, "sshd": true, "syslog": true, "systemd-network": true,
	"systemd-resolve": true, "systemd-timesync": true, "systemd-journal": true, "default": true,
}

// validate checks c and returns it with the checksum in lower case.
func (c Config) validate() (Config, error) {
	switch {
	case c.Username == "":
		return c, fmt.Errorf("username is required: %w", ErrInvalid)
	case len(c.Username) > 32:
		return c, fmt.Errorf("username %q is longer than 32 characters: %w", c.Username, ErrInvalid)
	case !usernameRe.MatchString(c.Username):
		return c, fmt.Errorf("username %q: want lower-case letters, digits, '_' and '-', starting with a letter or '_': %w", c.Username, ErrInvalid)
	case systemUsers[c.Username] || strings.HasPrefix(c.Username, "systemd-"):
		return c, fmt.Errorf("username %q is a system account: %w", c.Username, ErrInvalid)
	}
	if c.Hostname != "" {
		if err := validHostname(c.Hostname); err != nil {
			return c, err
		}
	}
	switch {
	case c.KiteKey == "":
		return c, fmt.Errorf("kite key is required: %w", ErrInvalid)
	case !jwtRe.MatchString(c.KiteKey):
		return c, fmt.Errorf("kite key is not a compact JWT (three base64url parts separated by dots): %w", ErrInvalid)
	}
	if err := validURL("kontrol URL", c.KontrolURL); err != nil {
		return c, err
	}
	if err := validURL("klient URL", c.KlientURL); err != nil {
		return c, err
	}
	if !sha256Re.MatchString(c.KlientSHA256) {
		return c, fmt.Errorf("klient sha256 %q: want 64 hex digits: %w", c.KlientSHA256, ErrInvalid)
	}
	c.KlientSHA256 = strings.ToLower(c.KlientSHA256)
	if c.CACert != "" && !x509.NewCertPool().AppendCertsFromPEM([]byte(c.CACert)) {
		return c, fmt.Errorf("CA certificate: no PEM certificate in it: %w", ErrInvalid)
	}
	return c, nil
}

func validHostname(h string) error {
	if len(h) > 253 {
		return fmt.Errorf("hostname %q is longer than 253 characters: %w", h, ErrInvalid)
	}
	for _, l := range strings.Split(h, ".") {
		if len(l) > 63 || !labelRe.MatchString(l) {
			return fmt.Errorf("hostname %q: label %q must be 1-63 letters, digits or '-', not starting or ending with '-': %w", h, l, ErrInvalid)
		}
	}
	return nil
}

func validURL(what, s string) error {
	if s == "" {
		return fmt.Errorf("%s is required: %w", what, ErrInvalid)
	}
	for _, r := range s {
		if r <= ' ' || r == 0x7f {
			return fmt.Errorf("%s %q contains whitespace or a control character: %w", what, s, ErrInvalid)
		}
	}
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("%s: %w: %w", what, ErrInvalid, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("%s %q: scheme must be http or https: %w", what, s, ErrInvalid)
	}
	if u.Host == "" {
		return fmt.Errorf("%s %q has no host: %w", what, s, ErrInvalid)
	}
	return nil
}
