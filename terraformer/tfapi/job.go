package tfapi

import (
	"fmt"
	"strings"
	"time"
)

// Op is a Terraform operation.
type Op string

// The operations a Request may ask for.
const (
	OpPlan    Op = "plan"
	OpApply   Op = "apply"
	OpDestroy Op = "destroy"
)

// Status is where a job is in its life. Succeeded, failed, cancelled and hung are final.
type Status string

// Job statuses.
const (
	StatusQueued    Status = "queued"
	StatusRunning   Status = "running"
	StatusSucceeded Status = "succeeded"
	StatusFailed    Status = "failed"
	StatusCancelled Status = "cancelled"
	StatusHung      Status = "hung"
)

// Final reports whether s is a final status.
func (s Status) Final() bool {
	switch s {
	case StatusSucceeded, StatusFailed, StatusCancelled, StatusHung:
		return true
	}
	return false
}

// Job is one Terraform run. The engine hands out copies; a Job never changes after it is returned.
type Job struct {
	ID        string `json:"id"`
	ContentID string `json:"contentId"`
	Op        Op     `json:"op"`
	TraceID   string `json:"traceId,omitempty"`
	Status    Status `json:"status"`
	// Percent is completed / planned resource changes, 0–100; 100 once the job succeeded.
	Percent int `json:"percent"`
	// Planned is the number of resource changes the plan announced (add + change + remove; a
	// replacement counts twice); Completed counts the changes Terraform finished or failed.
	Planned   int `json:"planned"`
	Completed int `json:"completed"`
	// Resources is the per-resource progress, in the order Terraform first mentioned them.
	Resources []ResourceProgress `json:"resources,omitempty"`
	// Log holds the last lines of Terraform's output (human-readable messages).
	Log    []string  `json:"log,omitempty"`
	Error  *JobError `json:"error,omitempty"`
	Result *Result   `json:"result,omitempty"`

	// Owner is the lease owner (Options.Owner) of the engine that ran the job; Host and PID
	// identify its process, so a restarted engine can tell that the job's process is gone.
	Owner string `json:"owner"`
	Host  string `json:"host"`
	PID   int    `json:"pid"`

	CreatedAt  time.Time `json:"createdAt"`
	StartedAt  time.Time `json:"startedAt,omitzero"`
	FinishedAt time.Time `json:"finishedAt,omitzero"`
	UpdatedAt  time.Time `json:"updatedAt"`
}

// Err returns the job's error as a Go error, or nil.
func (j *Job) Err() error {
	if j.Error == nil {
		return nil
	}
	return j.Error
}

// Resource progress statuses.
const (
	ResourcePlanned  = "planned"
	ResourceApplying = "applying"
	ResourceComplete = "complete"
	ResourceErrored  = "errored"
)

// ResourceProgress is what Terraform reported about one resource instance during a run.
type ResourceProgress struct {
	Address  string `json:"address"`
	Module   string `json:"module,omitempty"`
	Type     string `json:"type"`
	Name     string `json:"name"`
	Index    any    `json:"index,omitempty"`
	Provider string `json:"provider,omitempty"`
	// Action is the planned action (create, update, delete, replace, read, ...), then the action
	// of the hook in progress.
	Action string `json:"action"`
	Status string `json:"status"`
	// Message is Terraform's last message about the resource ("Still creating... [10s elapsed]").
	Message string `json:"message,omitempty"`
	IDValue string `json:"idValue,omitempty"`
	// Provisioner is the provisioner running or last run on the resource, with its status.
	Provisioner string `json:"provisioner,omitempty"`
	Elapsed     int    `json:"elapsedSeconds,omitempty"`
}

// Error kinds, in JobError.Kind.
const (
	KindTerraform = "terraform" // terraform exited with an error; Diagnostics says why
	KindCancelled = "cancelled" // Cancel was called
	KindHung      = "hung"      // no progress for Options.HangTimeout
	KindClosing   = "closing"   // the engine was closed while the job ran
	KindRestarted = "restarted" // the process running the job went away
	KindLease     = "lease"     // the lease was lost while the job ran
	KindInternal  = "internal"  // the engine itself failed (I/O, bad Terraform output)
)

// JobError is why a job did not succeed. It implements error.
type JobError struct {
	Kind    string `json:"kind"`
	Message string `json:"message"`
	// Diagnostics are Terraform's own error diagnostics (warnings are left out).
	Diagnostics []Diagnostic `json:"diagnostics,omitempty"`
}

func (e *JobError) Error() string { return e.Message }

// Diagnostic is one Terraform diagnostic, flattened.
type Diagnostic struct {
	Severity string `json:"severity"`
	Summary  string `json:"summary"`
	Detail   string `json:"detail,omitempty"`
	Address  string `json:"address,omitempty"`
	Filename string `json:"filename,omitempty"`
	Line     int    `json:"line,omitempty"`
	Column   int    `json:"column,omitempty"`
}

// String renders d the way the job error shows it: "main.tf:3,4: summary: detail".
func (d Diagnostic) String() string {
	var b strings.Builder
	if d.Filename != "" {
		b.WriteString(d.Filename)
		if d.Line > 0 {
			fmt.Fprintf(&b, ":%d", d.Line)
			if d.Column > 0 {
				fmt.Fprintf(&b, ",%d", d.Column)
			}
		}
		b.WriteString(": ")
	}
	if d.Address != "" {
		b.WriteString(d.Address + ": ")
	}
	b.WriteString(d.Summary)
	if d.Detail != "" {
		b.WriteString(": " + strings.Join(strings.Fields(d.Detail), " "))
	}
	return b.String()
}

// Result is what a successful (or, for apply and destroy, partly successful) job produced.
type Result struct {
	// Changes is what a plan would do (no-op resources left out).
	Changes []ResourceChange `json:"changes,omitempty"`
	// Summary counts the changes: planned ones for a plan, applied ones for apply and destroy.
	Summary ChangeSummary `json:"summary"`
	// Resources and Outputs are the state after apply or destroy, also after a failed or
	// cancelled one.
	Resources []StateResource   `json:"resources,omitempty"`
	Outputs   map[string]Output `json:"outputs,omitempty"`
}

// ChangeSummary is Terraform's change_summary.
type ChangeSummary struct {
	Add    int `json:"add"`
	Change int `json:"change"`
	Remove int `json:"remove"`
	Import int `json:"import,omitempty"`
}

// ResourceChange is one planned change, from `terraform show -json` of the saved plan.
type ResourceChange struct {
	Address  string   `json:"address"`
	Module   string   `json:"module,omitempty"`
	Mode     string   `json:"mode"`
	Type     string   `json:"type"`
	Name     string   `json:"name"`
	Index    any      `json:"index,omitempty"`
	Provider string   `json:"provider"`
	Actions  []string `json:"actions"`
	// After is the planned value; attributes known only after apply are listed in AfterUnknown.
	After        any `json:"after,omitempty"`
	AfterUnknown any `json:"afterUnknown,omitempty"`
	// Configured are the arguments and blocks the configuration sets for the resource (sorted;
	// count, for_each and depends_on are not among them): After holds every attribute, the
	// provider's defaults too. Only for resources of the root module.
	Configured []string `json:"configured,omitempty"`
}

// StateResource is one resource instance in the state.
type StateResource struct {
	Address  string         `json:"address"`
	Module   string         `json:"module,omitempty"`
	Mode     string         `json:"mode"`
	Type     string         `json:"type"`
	Name     string         `json:"name"`
	Index    any            `json:"index,omitempty"`
	Provider string         `json:"provider"`
	Tainted  bool           `json:"tainted,omitempty"`
	Values   map[string]any `json:"values,omitempty"`
}

// Output is one root module output. Sensitive values are included: the caller decides what to
// show.
type Output struct {
	Value     any  `json:"value"`
	Sensitive bool `json:"sensitive,omitempty"`
}

// EventType says what an Event carries.
type EventType string

// Event types.
const (
	// EventJob carries a snapshot of the whole job (Job). It is the first event of every Watch, and
	// it is sent again in place of events a slow watcher missed.
	EventJob EventType = "job"
	// EventProgress carries a resource's new progress (Resource) and the job's percentage.
	EventProgress EventType = "progress"
	// EventLog carries one line of Terraform output (Line).
	EventLog EventType = "log"
	// EventDiagnostic carries a Terraform diagnostic (Diagnostic).
	EventDiagnostic EventType = "diagnostic"
	// EventStatus says the job's status changed (Status).
	EventStatus EventType = "status"
	// EventFinal carries the finished job (Job); it is the last event, then the channel closes.
	EventFinal EventType = "final"
)

// Event is one notification about a job.
type Event struct {
	Type       EventType         `json:"type"`
	JobID      string            `json:"jobId"`
	Time       time.Time         `json:"time"`
	Status     Status            `json:"status"`
	Percent    int               `json:"percent"`
	Resource   *ResourceProgress `json:"resource,omitempty"`
	Line       string            `json:"line,omitempty"`
	Diagnostic *Diagnostic       `json:"diagnostic,omitempty"`
	Job        *Job              `json:"job,omitempty"`
}
