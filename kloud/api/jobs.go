package api

import "time"

// JobStatus is where a job is in its life: queued → running → succeeded | failed | cancelled.
type JobStatus string

// Job statuses.
const (
	JobQueued    JobStatus = "queued"
	JobRunning   JobStatus = "running"
	JobSucceeded JobStatus = "succeeded"
	JobFailed    JobStatus = "failed"
	JobCancelled JobStatus = "cancelled"
)

// Done reports whether the status is final.
func (st JobStatus) Done() bool {
	return st == JobSucceeded || st == JobFailed || st == JobCancelled
}

// Job is a long-running operation (stack apply, machine start, credential bootstrap, …) as
// job.get, job.list and job.cancel return it: the JSON of the store's job document.
type Job struct {
	ID     string         `json:"id"`
	Kind   string         `json:"kind"`   // e.g. "stack.apply"
	Target string         `json:"target"` // e.g. "stack/<id>"
	Owner  string         `json:"owner"`
	Params map[string]any `json:"params,omitempty"`

	Status  JobStatus      `json:"status"`
	Percent int            `json:"percentage"`
	Stage   string         `json:"stage,omitempty"`
	Message string         `json:"message,omitempty"`
	Error   string         `json:"error,omitempty"`
	Result  map[string]any `json:"result,omitempty"`

	// Log holds the last lines kept; LogSeq counts every line ever logged.
	Log    []string `json:"log,omitempty"`
	LogSeq int64    `json:"logSeq"`

	Runner          string    `json:"runner,omitempty"`
	LeaseUntil      time.Time `json:"leaseUntil,omitzero"`
	Attempt         int       `json:"attempt"`
	CancelRequested bool      `json:"cancelRequested,omitempty"`

	Rev        int64     `json:"rev"`
	CreatedAt  time.Time `json:"createdAt"`
	UpdatedAt  time.Time `json:"updatedAt"`
	StartedAt  time.Time `json:"startedAt,omitzero"`
	FinishedAt time.Time `json:"finishedAt,omitzero"`
}

// JobListParams filter job.list.
type JobListParams struct {
	Target string `json:"target,omitempty"`
	Limit  int    `json:"limit,omitempty"` // default 50, at most 200
}

// JobListResult is the result of job.list.
type JobListResult struct {
	Jobs []Job `json:"jobs"`
}

// JobWatchResult is the result of job.watch: the stream's subscription and the job as it is
// now; JobEvents follow as job.event notifications until the job ends.
type JobWatchResult struct {
	Subscription string `json:"subscription"`
	Job          Job    `json:"job"`
}

// JobEvent is one job.event notification: the job's progress as it changes, with the log lines
// added since the previous event.
type JobEvent struct {
	ID         string         `json:"id"`
	Status     JobStatus      `json:"status"`
	Percentage int            `json:"percentage"`
	Stage      string         `json:"stage,omitempty"`
	Message    string         `json:"message,omitempty"`
	Log        []string       `json:"log,omitempty"`
	Error      string         `json:"error,omitempty"`
	Result     map[string]any `json:"result,omitempty"`
}
