// Package store is kloud's persistence: one MongoDB database (go.mongodb.org/mongo-driver/v2)
// holding users, teams, credentials, templates, stacks, machines, durable jobs, leases, signing
// keys, token revocations and kite presence records. Start reading at [Open] (store.go); then
// [Store.AcquireLease] (lease.go), [Store.Transition] and [Store.TransitionIf] (transition.go),
// [Store.Persist] (persist.go: bookkeeping writes that must land, retried with their own
// context), [Jobs] (jobs.go), [Store.Seal] (seal.go), [Keys] and [Revocations] (keys.go) and
// [Kites] (kites.go).
//
// # Two backends, one code path
//
// With [Options.MongoURL] the store talks to that MongoDB (a replica set when several kloud
// replicas share it, ARCHITECTURE §9). Without it, [Open] starts an embedded, persistent FerretDB
// v1 (github.com/FerretDB/FerretDB/ferretdb, SQLite handler, telemetry off, no debug HTTP
// listener, its warnings and errors logged through Options.Logger) with its data in
// DataDir/db/, listening on a unix socket inside that directory (directory 0700, socket 0600;
// a private temporary directory when DataDir's path is too long for a socket), and connects the
// same driver to it. No TCP port is opened. A file lock on DataDir/db/LOCK keeps a second
// process (or a second Store) off the same data.
//
// # Why the embedded store uses exactly one connection
//
// FerretDB v1 has no transactions, and its handler implements every update (updateOne,
// findAndModify, upserts) as read, modify in Go, write back by _id, without a transaction
// (internal/handler/msg_findandmodify.go, common.UpdateDocument). Two connections racing on one
// document therefore lose updates: 8 goroutines × 100 $inc gave 100 instead of 800, and a
// compare-and-swap let 400 of 400 racers "win" instead of 50 (see
// ../shared/reference/feasibility-terraform-mongo.md, Q4). FerretDB serves the requests of one
// connection one after another, so the embedded store connects with maxPoolSize=1: every
// operation is serialised, and a single-document update with a condition in its filter is
// atomic, exactly as it is on MongoDB. That is the only atomicity this package relies on:
// never multi-document transactions, never read-then-write from Go. The single connection is
// also why no other client may talk to the embedded FerretDB.
//
// FerretDB v1 quirks this package absorbs: $push ignores $slice (the job log is trimmed with a
// second conditional update); TTL and partial indexes are not implemented (expired leases,
// revocations, kite records and finished jobs are pruned by code: the Prune methods);
// createIndexes with several already existing indexes panics (indexes are created one per
// call); nested documents decode as bson.M (the client decodes documents as bson.M throughout,
// and Job params/results are turned into plain maps). Only a filter that is exactly {_id: x} is
// pushed down to SQLite; anything else, including {_id: x, state: y}, scans the collection in
// Go, so collections must stay small (hundreds to a few thousand documents) on the embedded
// backend: a conditional update costs ~1.5 ms among a few documents and ~50 ms among 2000.
//
// # Collections and the fields that are indexed
//
// The collection names are the Coll* constants. Documents use string ids (see [NewID]).
// Indexes are created at start for these fields, so other packages must use these names:
//
//	users        username (unique)
//	teams        slug (unique)
//	credentials  owner, team
//	templates    owner, team
//	stacks       owner, team, templateId
//	machines     stackId, kiteId, owner
//	jobs         (target, createdAt), (owner, createdAt), (status, leaseUntil)   — see Job
//	locks        expiresAt                                                        — see Lease
//	keys         createdAt                                                        — see KeyRecord
//	revocations  _id is the jti; until                                            — see Revocation
//	kites        _id is the kite id; username, environment, name, version, region, hostname,
//	             replica, lastSeen                                                — see KiteRecord
//	sessions     username, expiresAt
//	meta         schema version and secret-key check (this package only)
//
// # Errors
//
// Sentinels ([ErrNotFound], [ErrLocked], [ErrConflict], [ErrState]) wrap the matching
// kite sentinels, so an RPC handler can return a store error as is and the kite layer maps it
// to the right JSON-RPC code.
//
// # Time
//
// All times are stored as BSON dates (millisecond precision) in UTC, and lease and job expiry
// compare against the clock of the process that writes ([Options.Now]). Replicas sharing one
// MongoDB need clocks that agree to well within a lease TTL.
package store
