package tfapi

import (
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"unicode"

	tfjson "github.com/hashicorp/terraform-json"
)

// Name is the kite name of terraformer.
const Name = "terraformer"

// The methods terraformer serves, and the notification method of its streams.
const (
	MethodPlan    = "terraformer.plan"
	MethodApply   = "terraformer.apply"
	MethodDestroy = "terraformer.destroy"
	MethodJob     = "terraformer.job"
	MethodWatch   = "terraformer.watch"
	MethodCancel  = "terraformer.cancel"
	MethodState   = "terraformer.state"
	MethodOutputs = "terraformer.outputs"
	EventMethod   = "terraformer.event"
)

// Limits on Request, checked before anything reaches the engine.
const (
	MaxFiles      = 256
	MaxTraceIDLen = 128
)

// Request is the params of terraformer.plan, terraformer.apply and terraformer.destroy.
type Request struct {
	// ContentID names the stack: one working directory, state and lease per id. Letters,
	// digits, '.', '_' and '-', at most 200 characters, not starting with '.' or '-'.
	ContentID string `json:"contentId"`
	// Files maps a file name (no directory; ending in .tf or .tf.json) to its content (HCL or
	// JSON). When non-empty it replaces every stored file of the content id; when empty the stored
	// files are used again (the usual case for destroy), and a content id with none is -32003.
	Files map[string]string `json:"files,omitempty"`
	// Variables become a JSON var file, so any JSON value works. Absent (nil) means the variables
	// of the previous request on this content id; present, even empty, replaces them.
	Variables map[string]any `json:"variables,omitzero"`
	// TraceID is recorded in the job and in terraformer's log lines.
	TraceID string `json:"traceId,omitempty"`
	// Preview (terraformer.plan with Files only) plans Files against the content id's state and
	// then puts its stored files and variables back (the engine's Request.Preview).
	Preview bool `json:"preview,omitempty"`
}

var (
	contentIDRe = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]{0,199}$`) // tfrun's rule
	varNameRe   = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_-]*$`)
	jobIDRe     = regexp.MustCompile(`^[0-9a-f]{24}$`)
)

func checkContentID(id string) error {
	if id == "" {
		return errors.New("contentId is required")
	}
	if !contentIDRe.MatchString(id) {
		return fmt.Errorf("contentId %q: want letters, digits, '.', '_' and '-' (at most 200, not starting with '.' or '-')", clip(id))
	}
	return nil
}

// Validate checks the request the way terraformer does before it reaches the engine.
func (r *Request) Validate() error {
	if err := checkContentID(r.ContentID); err != nil {
		return err
	}
	if len(r.Files) > MaxFiles {
		return fmt.Errorf("files: %d files, at most %d", len(r.Files), MaxFiles)
	}
	for name := range r.Files {
		if name == "" || len(name) > 255 || name != filepath.Base(name) || strings.HasPrefix(name, ".") ||
			!(strings.HasSuffix(name, ".tf") || strings.HasSuffix(name, ".tf.json")) {
			return fmt.Errorf("files: name %q: want a plain file name ending in .tf or .tf.json", clip(name))
		}
	}
	for name := range r.Variables {
		if !varNameRe.MatchString(name) {
			return fmt.Errorf("variables: %q is not a Terraform variable name", clip(name))
		}
	}
	if len(r.TraceID) > MaxTraceIDLen || strings.IndexFunc(r.TraceID, func(c rune) bool { return !unicode.IsPrint(c) }) >= 0 {
		return fmt.Errorf("traceId: at most %d printable characters", MaxTraceIDLen)
	}
	return nil
}

// SubmitResult is the result of terraformer.plan, apply and destroy.
type SubmitResult struct {
	JobID string `json:"jobId"`
}

// JobParams is the params of terraformer.job, terraformer.watch and terraformer.cancel.
type JobParams struct {
	JobID string `json:"jobId"`
}

// Validate checks the job id's shape.
func (p *JobParams) Validate() error {
	if p.JobID == "" {
		return errors.New("jobId is required")
	}
	if !jobIDRe.MatchString(p.JobID) {
		return fmt.Errorf("jobId %q: want 24 lowercase hex digits", clip(p.JobID))
	}
	return nil
}

// WatchResult is the result of terraformer.watch: the subscription of the terraformer.event
// stream.
type WatchResult struct {
	Subscription string `json:"subscription"`
}

// ContentParams is the params of terraformer.state and terraformer.outputs.
type ContentParams struct {
	ContentID string `json:"contentId"`
}

// Validate checks the content id.
func (p *ContentParams) Validate() error { return checkContentID(p.ContentID) }

// StateResult is the result of terraformer.state: `terraform show -json` of the content id's
// state as of the end of its last run.
type StateResult struct {
	ContentID string        `json:"contentId"`
	State     *tfjson.State `json:"state"`
}

// OutputsResult is the result of terraformer.outputs: the root module outputs, name → value
// (sensitive values included).
type OutputsResult struct {
	ContentID string         `json:"contentId"`
	Outputs   map[string]any `json:"outputs"`
}

// clip shortens a caller's string for an error message.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// Health is what terraformer's GET /healthz and /readyz say (Client.Health).
type Health struct {
	URL       string `json:"url"`
	Version   string `json:"version"`
	Terraform string `json:"terraform"`
	// PoolID is the id of the directory terraformer keeps stacks and jobs in (its --shared-dir
	// or --data-dir): terraformers of one pool report the same.
	PoolID    string    `json:"poolId"`
	Readiness Readiness `json:"readiness"`
}

// Readiness is /readyz's JSON body (the same shape as kloud's): 200 when Ready, else 503.
type Readiness struct {
	Ready bool `json:"ready"`
	// NotReady names the failing checks in order: "terraform" (the binary runs), "dataDir"
	// (writable), "kloudKeys" (kloud's GET /kite/keys answers, so kloud's calls authenticate).
	NotReady []string               `json:"notReady"`
	Checks   map[string]CheckResult `json:"checks"`
}

// CheckResult is one check's result in [Readiness].
type CheckResult struct {
	Ready bool   `json:"ready"`
	Error string `json:"error,omitempty"`
}

// Files turns file contents by name into a Request's Files.
func Files(files map[string][]byte) map[string]string {
	out := make(map[string]string, len(files))
	for n, b := range files {
		out[n] = string(b)
	}
	return out
}
