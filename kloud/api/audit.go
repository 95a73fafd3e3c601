package api

import (
	"context"
	"errors"
	"time"
)

// The audit log (kloud/audit.go; docs/operations.md "Audit log"): an append-only, hash-chained
// record of every mutating call, web login, terminal and port-forward connection.

// Audit methods (kloud administrators).
const (
	MethodAuditList   = "audit.list"
	MethodAuditVerify = "audit.verify"
)

// AuditMaxLimit is the most entries one audit.list returns.
const AuditMaxLimit = 1000

// AuditEntry is one entry of the audit log.
type AuditEntry struct {
	Seq    int64     `json:"seq"`
	Time   time.Time `json:"time"`
	User   string    `json:"user"`
	Remote string    `json:"remote"`
	Action string    `json:"action"` // an RPC method, or web.login, terminal.open, …
	Target string    `json:"target"` // "machine/<id>", "stack/<id>", "user/<name>", … or ""
	Result string    `json:"result"` // "ok" or "error"
	Code   int64     `json:"code,omitempty"`
	// DurationMs and Bytes: a connection's, on its close entry.
	DurationMs int64  `json:"durationMs,omitempty"`
	Bytes      int64  `json:"bytes,omitempty"`
	PrevHash   string `json:"prevHash"`
	Hash       string `json:"hash"`
}

// AuditListParams filter audit.list; zero fields select everything.
type AuditListParams struct {
	User   string    `json:"user,omitempty"`
	Action string    `json:"action,omitempty"`
	Target string    `json:"target,omitempty"` // "machine/<id>", or just the id
	Since  time.Time `json:"since,omitzero"`
	Limit  int       `json:"limit,omitempty"` // default 100, at most AuditMaxLimit
}

// Validate checks the limit.
func (p *AuditListParams) Validate() error {
	if p.Limit < 0 || p.Limit > AuditMaxLimit {
		return errors.New("limit: want 0 (the default, 100) to 1000")
	}
	return nil
}

// AuditListResult is audit.list's answer, newest first.
type AuditListResult struct {
	Entries []AuditEntry `json:"entries"`
}

// AuditVerifyResult is audit.verify's answer.
type AuditVerifyResult struct {
	OK bool `json:"ok"`
	// From: the kept chain starts after this seq (retention's checkpoint; 0: from the start).
	From    int64 `json:"from"`
	Checked int64 `json:"checked"`
	// Head: the newest seq verified and its hash (record it elsewhere to detect a rewrite).
	Head     int64  `json:"head"`
	HeadHash string `json:"headHash,omitempty"`
	// BadSeq: the first seq that was edited, removed or reordered; Problem says what.
	BadSeq  int64  `json:"badSeq,omitempty"`
	Problem string `json:"problem,omitempty"`
}

// AuditList returns audit entries, newest first (audit.list).
func (c *Client) AuditList(ctx context.Context, p AuditListParams) (AuditListResult, error) {
	return RPCAuditList.Call(ctx, c.c, p)
}

// AuditVerify walks the audit log's hash chain (audit.verify).
func (c *Client) AuditVerify(ctx context.Context) (AuditVerifyResult, error) {
	return RPCAuditVerify.Call(ctx, c.c, NoParams{})
}
