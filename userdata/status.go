package userdata

import (
	"bufio"
	"bytes"
	"encoding/json"
	"regexp"
	"time"
)

// Paths on the machine. They are part of the contract: klient, kloud and the providers read them.
const (
	KiteKeyPath          = "/etc/kloud/kite.key"
	CACertPath           = "/etc/kloud/ca.pem" // Config.CACert, when kloud's certificate needs it
	ProvisionScriptPath  = "/var/lib/kloud/provision.sh"
	UserScriptPath       = "/var/lib/kloud/user-script.sh"
	ProvisionStatusPath  = "/var/lib/kloud/provision.status"
	UserScriptStatusPath = "/var/lib/kloud/user-script.status"
	RunKlientPath        = "/var/lib/kloud/run-klient.sh"
	StartKlientPath      = "/var/lib/kloud/start-klient.sh"
	KlientPath           = "/opt/kloud/bin/klient"
	ProvisionLogPath     = "/var/log/kloud/provision.log"
	KlientLogPath        = "/var/log/kloud/klient.log"
	UserScriptLogPath    = "/var/log/kloud/user-script.log"
	SupervisorPIDPath    = "/run/kloud/klient-supervisor.pid"
	KlientUnitPath       = "/etc/systemd/system/kloud-klient.service"
	PerBootScriptPath    = "/var/lib/cloud/scripts/per-boot/kloud-klient.sh"
	CloudInitOutputPath  = "/var/log/cloud-init-output.log"
	// KlientUnit is the systemd unit that runs klient when the machine has systemd.
	KlientUnit = "kloud-klient.service"
)

// Steps of provision.sh, in order, as they appear in marker lines.
const (
	StepDownload    = "download"
	StepVerify      = "verify"
	StepInstall     = "install"
	StepStartKlient = "start-klient"
	StepUserScript  = "user-script"
	StepDone        = "done"
)

// Marker statuses.
const (
	StatusStart  = "start"
	StatusOK     = "ok"
	StatusFailed = "failed"
)

// MarkerPrefix starts every marker line provision.sh prints.
const MarkerPrefix = "KLOUD-PROVISION "

// Marker is one parsed marker line.
type Marker struct {
	Step   string
	Status string
	Detail string
}

var markerRe = regexp.MustCompile(`KLOUD-PROVISION step=([a-z-]+) status=([a-z]+)(?: detail=("(?:[^"\\]|\\.)*"))?\s*$`)

// ParseMarkers returns the marker lines found in a log (e.g. the tail of
// /var/log/cloud-init-output.log or a serial console), in order. Other lines are ignored, as are
// markers whose detail does not decode.
func ParseMarkers(log []byte) []Marker {
	var out []Marker
	sc := bufio.NewScanner(bytes.NewReader(log))
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		m := markerRe.FindSubmatch(sc.Bytes())
		if m == nil {
			continue
		}
		mk := Marker{Step: string(m[1]), Status: string(m[2])}
		if len(m[3]) > 0 {
			if err := json.Unmarshal(m[3], &mk.Detail); err != nil {
				continue
			}
		}
		out = append(out, mk)
	}
	return out
}

// ProvisionStatus is the JSON in /var/lib/kloud/provision.status: the last marker printed.
type ProvisionStatus struct {
	Step   string    `json:"step"`
	Status string    `json:"status"`
	Detail string    `json:"detail"`
	Time   time.Time `json:"time"`
}

// UserScriptStatus is the JSON in /var/lib/kloud/user-script.status. ExitCode and FinishedAt
// are absent while State is "running".
type UserScriptStatus struct {
	State      string     `json:"state"` // running | done | failed
	ExitCode   *int       `json:"exitCode,omitempty"`
	StartedAt  time.Time  `json:"startedAt"`
	FinishedAt *time.Time `json:"finishedAt,omitempty"`
}

// User script states.
const (
	UserScriptRunning = "running"
	UserScriptDone    = "done"
	UserScriptFailed  = "failed"
)
