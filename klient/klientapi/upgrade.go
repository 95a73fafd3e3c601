package klientapi

import (
	"fmt"
	"net/url"
	"regexp"
)

// MethodUpgrade makes klient replace itself with the klient binary kloud serves (DownloadPath
// on kontrol's origin, the one cloud-init installed it from) and restart, keeping every terminal
// session (their shells live in holder processes: docs/user-guide.md). klient downloads it,
// checks its SHA-256 against UpgradeParams.SHA256, runs it once (--version), renames it over its
// own binary, answers, and then re-executes itself. Anything that fails before the rename leaves
// the running klient as it was. Only kloud may ask (on the connection klient dialed).
const MethodUpgrade = "klient.upgrade"

// FeatureUpgrade is in Info.Features of a klient that serves klient.upgrade.
const FeatureUpgrade = "upgrade"

// DownloadPath is where kloud serves the klient binary.
const DownloadPath = "/dl/klient"

var sha256RE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// UpgradeParams are klient.upgrade's params.
type UpgradeParams struct {
	// SHA256 is the hex SHA-256 the downloaded binary must have (kloud's of the binary it serves).
	SHA256 string `json:"sha256"`
}

// Validate implements kite.Validator.
func (p *UpgradeParams) Validate() error {
	if !sha256RE.MatchString(p.SHA256) {
		return fmt.Errorf("sha256 %q: want 64 lowercase hex digits", p.SHA256)
	}
	return nil
}

// UpgradeResult is klient.upgrade's result.
type UpgradeResult struct {
	OldVersion string `json:"oldVersion"`
	NewVersion string `json:"newVersion"`
	OldSHA256  string `json:"oldSha256"`
	NewSHA256  string `json:"newSha256"`
	// Sessions is how many terminal sessions klient keeps across the restart.
	Sessions int `json:"sessions"`
}

// DownloadURL is the klient binary's URL on kontrolURL's origin (ws→http, wss→https).
func DownloadURL(kontrolURL string) (string, error) {
	k, err := url.Parse(kontrolURL)
	if err != nil {
		return "", fmt.Errorf("kontrol url: %w", err)
	}
	scheme := k.Scheme
	switch scheme {
	case "ws":
		scheme = "http"
	case "wss":
		scheme = "https"
	case "http", "https":
	default:
		return "", fmt.Errorf("kontrol url %q: want http(s) or ws(s)", kontrolURL)
	}
	return (&url.URL{Scheme: scheme, Host: k.Host, Path: DownloadPath}).String(), nil
}
