package api

import (
	"context"
	"time"
)

// MethodKloudDoctor checks the deployment from kloud's side (kloud administrators; `kloud
// doctor`, docs/operations.md).
const MethodKloudDoctor = "kloud.doctor"

// DoctorCheck is one check of kloud.doctor (and of `kloud doctor`'s own).
type DoctorCheck struct {
	Name string `json:"name"`
	OK   bool   `json:"ok"`
	// Required: the deployment does not work while it fails (`kloud doctor` exits 1).
	Required bool `json:"required"`
	// Detail is what was found (a version, a skew, a path).
	Detail string `json:"detail,omitempty"`
	Error  string `json:"error,omitempty"`
	// Fix says what to do when it fails.
	Fix string `json:"fix,omitempty"`
}

// DoctorResult is kloud.doctor's result.
type DoctorResult struct {
	KloudVersion string `json:"kloudVersion"`
	// ServerTime is kloud's clock when it answered (the CLI compares its own).
	ServerTime time.Time     `json:"serverTime"`
	Checks     []DoctorCheck `json:"checks"`
}

// Doctor runs kloud.doctor.
func (c *Client) Doctor(ctx context.Context) (DoctorResult, error) {
	return RPCKloudDoctor.Call(ctx, c.c, NoParams{})
}
