package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Audit is the audit collection: an append-only, hash-chained log of what users did
// (kloud/audit.go decides what is recorded). Each entry's _id is its sequence number, 1, 2, 3…,
// and its Hash is SHA-256 over the canonical encoding of its fields and the previous entry's
// hash ([AuditEntry.ComputeHash]), so editing, removing or reordering an entry breaks the chain
// from there on and [Audit.Verify] names the first broken seq.
//
// Appending is atomic across goroutines and kloud replicas sharing one database: an entry is
// inserted with _id = the last seq + 1 and the last hash as its PrevHash; the unique _id makes
// exactly one of two racing appends win, and the loser reads the new last entry and tries
// again. The last entry is found from the head record (meta "auditHead": a seq every append
// raises with $max-like conditional update), then by _id lookups forward from it, so an append
// never scans the collection (FerretDB v1 pushes only {_id: x} filters down).
//
// Pruning ([Audit.Prune]) deletes the oldest entries and first records the checkpoint (meta
// "auditCheckpoint": the seq and hash of the last pruned entry), from which Verify starts: the
// kept chain still verifies. The newest entry is never pruned, so the chain always has a head.
type Audit struct{ s *Store }

// Audit returns the audit log repository.
func (s *Store) Audit() *Audit { return &Audit{s} }

func (r *Audit) coll() *mongo.Collection { return r.s.db.Collection(CollAudit) }

const (
	auditHeadID       = "auditHead"
	auditCheckpointID = "auditCheckpoint"
	// auditAppendTries bounds the retries of one append that keeps losing races.
	auditAppendTries = 100
)

// Audit results.
const (
	AuditOK    = "ok"
	AuditError = "error"
)

// AuditEntry is one entry of the audit log. It never holds a secret: no params, no bodies, no
// error messages; only who did what to which thing, and how it ended.
type AuditEntry struct {
	Seq      int64     `bson:"_id"`
	Time     time.Time `bson:"time"` // millisecond precision (what the database keeps)
	User     string    `bson:"user"`
	Remote   string    `bson:"remote"` // the client's address
	Action   string    `bson:"action"` // an RPC method, or web.login, terminal.open, …
	Target   string    `bson:"target"` // "machine/<id>", "stack/<id>", "user/<name>", … or ""
	Result   string    `bson:"result"` // AuditOK or AuditError
	Code     int64     `bson:"code"`   // the error's code (JSON-RPC code, or HTTP status)
	Duration int64     `bson:"durationMs,omitempty"`
	Bytes    int64     `bson:"bytes,omitempty"`
	PrevHash string    `bson:"prevHash"`
	Hash     string    `bson:"hash"`
}

// ComputeHash returns the entry's hash: hex SHA-256 of a JSON array of its fields in a fixed
// order (seq, time as RFC 3339 UTC with milliseconds, user, remote, action, target, result,
// code, duration, bytes, prevHash). Hash itself is not part of it.
func (e AuditEntry) ComputeHash() string {
	b, _ := json.Marshal([]any{e.Seq, e.Time.UTC().Format("2006-01-02T15:04:05.000Z07:00"), e.User, e.Remote,
		e.Action, e.Target, e.Result, e.Code, e.Duration, e.Bytes, e.PrevHash})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// auditMark is a seq and the hash of the entry with that seq (the head, the checkpoint).
type auditMark struct {
	ID   string `bson:"_id"`
	Seq  int64  `bson:"seq"`
	Hash string `bson:"hash"`
}

func (r *Audit) mark(ctx context.Context, id string) (auditMark, error) {
	var m auditMark
	err := r.s.Collection(CollMeta).FindOne(ctx, bson.M{"_id": id}).Decode(&m)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return auditMark{ID: id}, nil
	}
	if err != nil {
		return m, fmt.Errorf("audit %s: %w", id, err)
	}
	return m, nil
}

// raiseMark sets mark id to (seq, hash) unless it already is at seq or beyond.
func (r *Audit) raiseMark(ctx context.Context, id string, seq int64, hash string) error {
	_, err := r.s.Collection(CollMeta).UpdateOne(ctx, bson.M{"_id": id, "seq": bson.M{"$lt": seq}},
		bson.M{"$set": bson.M{"seq": seq, "hash": hash}}, options.UpdateOne().SetUpsert(true))
	if err != nil && !IsDuplicateKey(err) { // duplicate: the mark exists at seq or beyond
		return fmt.Errorf("audit %s: %w", id, err)
	}
	return nil
}

func (r *Audit) get(ctx context.Context, seq int64) (AuditEntry, bool, error) {
	var e AuditEntry
	err := r.coll().FindOne(ctx, bson.M{"_id": seq}).Decode(&e)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return e, false, nil
	}
	if err != nil {
		return e, false, fmt.Errorf("audit entry %d: %w", seq, err)
	}
	return e, true, nil
}

// last returns the seq and hash of the newest entry (0, "" for an empty log): from the head
// record (or the checkpoint, if further), forward by _id while a next entry exists.
func (r *Audit) last(ctx context.Context) (int64, string, error) {
	seq, hash, err := r.head(ctx)
	if err != nil {
		return 0, "", err
	}
	return r.forward(ctx, seq, hash)
}

// head returns the head record's seq and hash, or the checkpoint's if it is further: the newest
// entry as the last append left it (two reads by string _id; no entry is read).
func (r *Audit) head(ctx context.Context) (int64, string, error) {
	head, err := r.mark(ctx, auditHeadID)
	if err != nil {
		return 0, "", err
	}
	cp, err := r.mark(ctx, auditCheckpointID)
	if err != nil {
		return 0, "", err
	}
	if cp.Seq > head.Seq {
		head = cp
	}
	return head.Seq, head.Hash, nil
}

// forward follows the entries after seq by _id while a next one exists, and returns the last.
// Each step reads every entry on the embedded store (the _id is a number: no pushdown, doc.go),
// so appends take it only when the head lags.
func (r *Audit) forward(ctx context.Context, seq int64, hash string) (int64, string, error) {
	for {
		e, ok, err := r.get(ctx, seq+1)
		if err != nil {
			return 0, "", err
		}
		if !ok {
			return seq, hash, nil
		}
		seq, hash = e.Seq, e.Hash
	}
}

// Append adds e at the end of the chain: it sets e's Seq, PrevHash and Hash (and Time, to now,
// if zero) and returns the entry as stored.
func (r *Audit) Append(ctx context.Context, e AuditEntry) (AuditEntry, error) {
	if e.Time.IsZero() {
		e.Time = r.s.Now()
	}
	e.Time = e.Time.UTC().Truncate(time.Millisecond)
	// One append of this store at a time: twenty concurrent calls retrying against each other
	// made ~n²/2 attempts on the embedded store's one connection and ran out of time in CI.
	select {
	case r.s.auditSem <- struct{}{}:
		defer func() { <-r.s.auditSem }()
	case <-ctx.Done():
		return e, fmt.Errorf("audit append: waiting for this store's previous appends: %w", ctx.Err())
	}
	// After the head record, not after the newest entry: finding that reads entries by their
	// numeric _id, which scans the whole log on the embedded store (the P2 bench of 2026-12-01: 10,000
	// audited kontrol.createKey calls slowed to 8 a second). The head is the newest entry unless
	// another replica's append, or one cut before it raised the head, went further: then the
	// insert meets a duplicate _id and the append follows the entries to the end.
	seq, hash, err := r.head(ctx)
	if err != nil {
		return e, fmt.Errorf("audit append: %w", err)
	}
	for range auditAppendTries {
		e.Seq, e.PrevHash = seq+1, hash
		e.Hash = e.ComputeHash()
		if _, err := r.coll().InsertOne(ctx, e); err != nil {
			if IsDuplicateKey(err) { // another append took this seq: chain onto the newest
				if seq, hash, err = r.forward(ctx, seq, hash); err != nil {
					return e, fmt.Errorf("audit append: %w", err)
				}
				continue
			}
			return e, fmt.Errorf("audit append %d: %w", e.Seq, err)
		}
		// The head only speeds up the next append's search (and lets Verify notice entries
		// removed from the end): failing to raise it loses nothing.
		if err := r.raiseMark(ctx, auditHeadID, e.Seq, e.Hash); err != nil {
			r.s.log.Warn("audit: raise head", "seq", e.Seq, "err", err)
		}
		return e, nil
	}
	return e, fmt.Errorf("audit append: lost the race for the next seq %d times: %w", auditAppendTries, ErrConflict)
}

// AuditFilter selects entries for [Audit.List]. Zero fields select everything.
type AuditFilter struct {
	User   string
	Action string
	// Target is a whole target ("machine/<id>") or just its id.
	Target string
	Since  time.Time
	Limit  int // default 100
}

// List returns the entries f selects, newest first.
func (r *Audit) List(ctx context.Context, f AuditFilter) ([]AuditEntry, error) {
	q := bson.M{}
	if f.User != "" {
		q["user"] = f.User
	}
	if f.Action != "" {
		q["action"] = f.Action
	}
	if f.Target != "" {
		q["$or"] = bson.A{bson.M{"target": f.Target}, bson.M{"target": bson.M{"$regex": "/" + regexp.QuoteMeta(f.Target) + "(:[0-9]+)?$"}}}
	}
	if !f.Since.IsZero() {
		q["time"] = bson.M{"$gte": f.Since}
	}
	if f.Limit <= 0 {
		f.Limit = 100
	}
	cur, err := r.coll().Find(ctx, q, options.Find().SetSort(bson.D{{Key: "_id", Value: -1}}).SetLimit(int64(f.Limit)))
	if err != nil {
		return nil, fmt.Errorf("list audit entries: %w", err)
	}
	out := []AuditEntry{}
	if err := cur.All(ctx, &out); err != nil {
		return nil, fmt.Errorf("list audit entries: %w", err)
	}
	return out, nil
}

// AuditVerify is what [Audit.Verify] found.
type AuditVerify struct {
	OK bool
	// From is the seq the kept chain starts after (the checkpoint of pruning; 0: none);
	// Checked is how many entries were checked; Head is the newest seq and HeadHash its hash.
	From, Checked, Head int64
	HeadHash            string
	// BadSeq is the first seq that does not verify, and Problem says why (OK false).
	BadSeq  int64
	Problem string
}

// Verify walks the chain from the checkpoint: every seq must follow the one before (none
// removed), carry the previous entry's hash (none removed or reordered) and its own hash over
// its fields (none edited); the newest must not be behind the head record (none removed from
// the end). A walk that finds a problem while a prune (of any replica) raised the checkpoint
// is walked again from the new one: the entries the prune deleted meanwhile are no gap.
func (r *Audit) Verify(ctx context.Context) (AuditVerify, error) {
	for attempt := 1; ; attempt++ {
		v, err := r.verifyOnce(ctx)
		if err != nil || v.OK || attempt == 5 {
			return v, err
		}
		cp, err := r.mark(ctx, auditCheckpointID)
		if err != nil {
			return AuditVerify{}, fmt.Errorf("audit verify: %w", err)
		}
		if cp.Seq == v.From {
			return v, nil // the chain is broken where nothing was pruned
		}
	}
}

// verifyOnce is one walk of Verify's.
func (r *Audit) verifyOnce(ctx context.Context) (AuditVerify, error) {
	cp, err := r.mark(ctx, auditCheckpointID)
	if err != nil {
		return AuditVerify{}, fmt.Errorf("audit verify: %w", err)
	}
	head, err := r.mark(ctx, auditHeadID)
	if err != nil {
		return AuditVerify{}, fmt.Errorf("audit verify: %w", err)
	}
	v := AuditVerify{From: cp.Seq, Head: cp.Seq, HeadHash: cp.Hash}
	bad := func(seq int64, format string, args ...any) (AuditVerify, error) {
		v.BadSeq, v.Problem = seq, fmt.Sprintf(format, args...)
		return v, nil
	}
	cur, err := r.coll().Find(ctx, bson.M{"_id": bson.M{"$gt": cp.Seq}}, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		return v, fmt.Errorf("audit verify: %w", err)
	}
	defer cur.Close(ctx)
	prevSeq, prevHash := cp.Seq, cp.Hash
	for cur.Next(ctx) {
		var e AuditEntry
		if err := cur.Decode(&e); err != nil {
			// A field of the wrong type: someone wrote it by hand.
			var id struct {
				Seq any `bson:"_id"`
			}
			_ = cur.Decode(&id)
			return bad(prevSeq+1, "entry %v cannot be read: %v", id.Seq, err)
		}
		switch {
		case e.Seq != prevSeq+1:
			return bad(prevSeq+1, "entry %d is missing (removed): the next entry is %d", prevSeq+1, e.Seq)
		case e.PrevHash != prevHash:
			return bad(e.Seq, "entry %d does not follow entry %d (removed, reordered or edited before it): its prevHash differs", e.Seq, prevSeq)
		case e.Hash != e.ComputeHash():
			return bad(e.Seq, "entry %d was edited: its hash does not match its fields", e.Seq)
		}
		prevSeq, prevHash = e.Seq, e.Hash
		v.Checked++
	}
	if err := cur.Err(); err != nil {
		return v, fmt.Errorf("audit verify: %w", err)
	}
	v.Head, v.HeadHash = prevSeq, prevHash
	if head.Seq > prevSeq {
		return bad(prevSeq+1, "entries %d to %d are missing (removed from the end)", prevSeq+1, head.Seq)
	}
	if head.Seq == prevSeq && head.Seq > 0 && head.Hash != prevHash {
		return bad(prevSeq, "entry %d is not the entry that was appended (replaced)", prevSeq)
	}
	v.OK = true
	return v, nil
}

// Prune deletes the entries older than before, oldest first, but never the newest entry. It
// first raises the checkpoint to the last entry it deletes, so Verify starts there. It returns
// how many entries it deleted and the new checkpoint's seq.
func (r *Audit) Prune(ctx context.Context, before time.Time, o PruneOptions) (int64, int64, error) {
	var deleted int64
	for {
		cp, err := r.mark(ctx, auditCheckpointID)
		if err != nil {
			return deleted, 0, fmt.Errorf("audit prune: %w", err)
		}
		cur, err := r.coll().Find(ctx, bson.M{"_id": bson.M{"$gt": cp.Seq}, "time": bson.M{"$lt": before}},
			options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}).SetLimit(int64(o.batch())))
		if err != nil {
			return deleted, cp.Seq, fmt.Errorf("audit prune: %w", err)
		}
		var old []AuditEntry
		if err := cur.All(ctx, &old); err != nil {
			return deleted, cp.Seq, fmt.Errorf("audit prune: %w", err)
		}
		last, _, err := r.last(ctx)
		if err != nil {
			return deleted, cp.Seq, fmt.Errorf("audit prune: %w", err)
		}
		// Only a run of entries that follows the checkpoint without a gap, and never the newest.
		n := 0
		for n < len(old) && old[n].Seq == cp.Seq+int64(n)+1 && old[n].Seq < last {
			n++
		}
		if n == 0 {
			return deleted, cp.Seq, nil
		}
		upto := old[n-1]
		if err := r.raiseMark(ctx, auditCheckpointID, upto.Seq, upto.Hash); err != nil {
			return deleted, cp.Seq, fmt.Errorf("audit prune: %w", err)
		}
		res, err := r.coll().DeleteMany(ctx, bson.M{"_id": bson.M{"$lte": upto.Seq}})
		if err != nil {
			return deleted, upto.Seq, fmt.Errorf("audit prune: %w", err)
		}
		deleted += res.DeletedCount
		if o.AfterBatch != nil {
			o.AfterBatch(deleted)
		}
		if n < len(old) || len(old) < o.batch() {
			return deleted, upto.Seq, nil
		}
	}
}
