package tfrun

import (
	"errors"

	"github.com/kloud-dev/kloud/terraformer/tfapi"
)

// Sentinel errors. Callers test with errors.Is; the RPC layer maps them to its error codes.
var (
	// ErrLocked means another run holds the content id's lease.
	ErrLocked = errors.New("tfrun: locked")
	// ErrNotFound means no such job, or nothing stored for the content id.
	ErrNotFound = errors.New("tfrun: not found")
	// ErrInvalid means the request is malformed (bad content id, file name, op).
	ErrInvalid = errors.New("tfrun: invalid request")
	// ErrState means the job is not in a state that allows the call (cancel of a finished job).
	ErrState = errors.New("tfrun: not allowed in this state")
	// ErrClosed means the engine is closing or closed.
	ErrClosed = errors.New("tfrun: engine closed")
)

// The job, event and result types are terraformer's wire types (terraformer/tfapi), named here
// too so that the engine's code reads as before.
type (
	Op               = tfapi.Op
	Status           = tfapi.Status
	Job              = tfapi.Job
	ResourceProgress = tfapi.ResourceProgress
	JobError         = tfapi.JobError
	Diagnostic       = tfapi.Diagnostic
	Result           = tfapi.Result
	ChangeSummary    = tfapi.ChangeSummary
	ResourceChange   = tfapi.ResourceChange
	StateResource    = tfapi.StateResource
	Output           = tfapi.Output
	EventType        = tfapi.EventType
	Event            = tfapi.Event
)

// The values of Op, Status, ResourceProgress.Status, JobError.Kind and EventType (tfapi's).
const (
	OpPlan           = tfapi.OpPlan
	OpApply          = tfapi.OpApply
	OpDestroy        = tfapi.OpDestroy
	StatusQueued     = tfapi.StatusQueued
	StatusRunning    = tfapi.StatusRunning
	StatusSucceeded  = tfapi.StatusSucceeded
	StatusFailed     = tfapi.StatusFailed
	StatusCancelled  = tfapi.StatusCancelled
	StatusHung       = tfapi.StatusHung
	ResourcePlanned  = tfapi.ResourcePlanned
	ResourceApplying = tfapi.ResourceApplying
	ResourceComplete = tfapi.ResourceComplete
	ResourceErrored  = tfapi.ResourceErrored
	KindTerraform    = tfapi.KindTerraform
	KindCancelled    = tfapi.KindCancelled
	KindHung         = tfapi.KindHung
	KindClosing      = tfapi.KindClosing
	KindRestarted    = tfapi.KindRestarted
	KindLease        = tfapi.KindLease
	KindInternal     = tfapi.KindInternal
	EventJob         = tfapi.EventJob
	EventProgress    = tfapi.EventProgress
	EventLog         = tfapi.EventLog
	EventDiagnostic  = tfapi.EventDiagnostic
	EventStatus      = tfapi.EventStatus
	EventFinal       = tfapi.EventFinal
)

func validOp(o Op) bool { return o == OpPlan || o == OpApply || o == OpDestroy }

// Request asks for one Terraform operation on a content id.
type Request struct {
	Op Op `json:"op"`
	// ContentID names the stack: one working directory, state and lease per id. Letters, digits,
	// '.', '_' and '-', at most 200 characters, not starting with '.' or '-'.
	ContentID string `json:"contentId"`
	// Files maps a file name (no directories; ending in .tf or .tf.json) to its content. When
	// non-empty it replaces every stored content file; when empty the stored files are used again
	// (the usual case for destroy).
	Files map[string][]byte `json:"files,omitempty"`
	// Variables are passed to Terraform in a JSON var file, so any JSON value works. nil means the
	// variables of the previous request on this content id; non-nil (even empty) replaces them.
	Variables map[string]any `json:"variables,omitempty"`
	// TraceID is recorded in the job and in log lines.
	TraceID string `json:"traceId,omitempty"`
	// Preview (plan only, with Files) plans Files against the content id's state but leaves
	// its stored files, variables and plan as they were: they are put back when the run ends
	// (preview.go). A process killed mid-run leaves the previewed files until the next request
	// that brings files.
	Preview bool `json:"preview,omitempty"`
}

// cloneJob copies j for a caller: the engine hands out copies.
func cloneJob(j *Job) *Job {
	c := *j
	c.Resources = append([]ResourceProgress(nil), j.Resources...)
	c.Log = append([]string(nil), j.Log...)
	// Error and Result are never modified after they are set, so sharing them is safe.
	return &c
}
