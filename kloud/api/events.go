package api

import (
	"fmt"
	"slices"
	"time"
)

// event.watch (kloud/eventfeed.go): a stream of what changed among the things the caller may
// see, so a page shows a change without polling. Each notification names the kind and id of
// what changed; the page reads that again through its get or list method (the same
// permissions), or drops it when the op is "deleted". A "resync" event means events were lost
// (the page fell behind, or kloud could not tell exactly what changed): read everything again.

// EventTopics lists the topics event.watch offers.
func EventTopics() []string {
	return []string{"machines", "agents", "shares", "stacks", "jobs", "snapshots", "buckets", "providers"}
}

// EventWatchParams choose what event.watch streams: the topics (at least one of EventTopics())
// and, optionally, only what belongs to one stack (its machines, jobs and bucket claims, and
// the stack itself).
type EventWatchParams struct {
	Topics  []string `json:"topics"`
	StackID string   `json:"stackId,omitempty"`
}

// Validate checks the topics.
func (p *EventWatchParams) Validate() error {
	topics := EventTopics()
	if len(p.Topics) == 0 {
		return fmt.Errorf("topics: name at least one of %v", topics)
	}
	if len(p.Topics) > len(topics) {
		return fmt.Errorf("topics: at most %d", len(topics))
	}
	for _, t := range p.Topics {
		if !slices.Contains(topics, t) {
			return fmt.Errorf("topics: unknown topic %q (one of %v)", t, topics)
		}
	}
	if len(p.StackID) > 64 {
		return fmt.Errorf("stackId: at most 64 characters")
	}
	return nil
}

// EventWatchResult is the result of event.watch: the stream's subscription. Events follow as
// event.notify notifications until the caller unsubscribes or the connection closes.
type EventWatchResult struct {
	Subscription string   `json:"subscription"`
	Topics       []string `json:"topics"`
}

// Event is one event.notify notification.
type Event struct {
	Topics  []string  `json:"topics"`            // the topics it belongs to (a resync: none)
	Kind    string    `json:"kind,omitempty"`    // machine, stack, job, snapshot, bucket, provider
	ID      string    `json:"id,omitempty"`      // the thing's id
	Op      string    `json:"op"`                // changed, deleted or resync
	StackID string    `json:"stackId,omitempty"` // the stack it belongs to, if any
	At      time.Time `json:"at"`                // when kloud saw the change
	// Job is a job's progress (kind job): what job.get would show of it now.
	Job *JobEvent `json:"job,omitempty"`
}
