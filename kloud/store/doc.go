// Package store is kloud's persistence: one MongoDB database (go.mongodb.org/mongo-driver/v2)
// holding users, teams, credentials, templates, stacks, machines, durable jobs, leases, signing
// keys, token revocations and kite presence records. Start reading at [Open] (store.go); then
// the documents (model.go, defined in kloud/model: [User], [Team], [Credential], [Template],
// [Stack], [Machine]) and
// their typed repositories (repos.go: [Store.Users], [Store.Teams], [Store.Credentials],
// [Store.Templates], [Store.Stacks], [Store.Machines]);
// [Store.AcquireLease] (lease.go), [Store.Transition] and [Store.TransitionIf] (transition.go),
// [Store.Persist] (persist.go: bookkeeping writes that must land, retried with their own
// context), [Jobs] (jobs.go; [ProgressWriter] in progress.go coalesces a job's progress),
// [Store.Seal] (seal.go), [Keys] and [Revocations] (keys.go), [Kites] (kites.go), [ChangeLog]
// (changelog.go: several replicas' events) and the Prune methods (prune.go).
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
// compare-and-swap let 400 of 400 racers "win" instead of 50 (measured against FerretDB v1.24
// when the store was chosen). FerretDB serves the requests of one
// connection one after another, so the embedded store connects with maxPoolSize=1: every
// operation is serialised, and a single-document update with a condition in its filter is
// atomic, exactly as it is on MongoDB. That is the only atomicity this package relies on:
// never multi-document transactions, never read-then-write from Go. The single connection is
// also why no other client may talk to the embedded FerretDB.
//
// Several kloud replicas therefore never share a FerretDB directly: they share a MongoDB
// replica set, or, in a small deployment, `kloud store serve` (kloud/store/storeserve), which
// owns the embedded FerretDB (the same DataDir/db/ and lock) and executes its clients'
// commands one at a time per database, so that a conditional single-document update is atomic
// across all of them. With a MongoURL nothing here relies on more: the read-then-write paths
// ([Jobs] on the embedded backend, under the store's write lock) are taken only without one.
// kloud/store/storerace is the check (and `kloud doctor --mongo-url` runs it).
//
// FerretDB v1 quirks this package absorbs: $push ignores $slice (the job log is trimmed with a
// second conditional update); TTL and partial indexes are not implemented (see "Retention");
// createIndexes with several already existing indexes panics (indexes are created one per
// call); nested documents decode as bson.M (the client decodes documents as bson.M throughout,
// and Job params/results are turned into plain maps).
//
// # What the embedded backend answers without a scan
//
// FerretDB v1.24's SQLite handler pushes exactly one kind of filter down to SQLite: one that is
// {_id: x} and nothing else, with x a string or ObjectID (internal/backends/sqlite/collection.go,
// Query; the same for find, update, findAndModify and delete). Anything else, including
// {_id: x, state: y}, reads and decodes every document of the collection in Go; the secondary
// indexes above only enforce uniqueness there. And even {_id: x} scanned the SQLite table:
// FerretDB's own _id index is on an expression SQLite does not match to the one its queries
// compare, so [Open] adds an index on that very expression to every collection's table
// (embedded.go, indexIDs). Lookups, updates and deletes by _id are then flat in the size of
// the collection (bench/storegrowth: ~1-4 ms with 100 or 10,000 finished jobs), while a filter
// with a condition costs in proportion to it (the same job update with {_id, status} in the
// filter: ~0.1 s with 100 finished jobs, ~16 s with 10,000, on a loaded 2-CPU machine).
//
// So the hot path of the collection that grows works by _id. Every write of the jobs
// collection is made by [Jobs] (its Prune included); on the embedded backend each conditional
// one is a read by _id, the condition checked in Go, and the write by _id, under the store's
// write lock, which every write of that collection takes: as atomic as the filter, which
// MongoDB keeps (one command, served by the indexes). [Store.Transition] keeps its filter
// (stacks and machines are also written by other packages through [Store.Collection], outside
// that lock), so it costs in proportion to the number of stacks or machines (~0.1 s among 1,000
// machines on that machine), not of jobs; [Store.Exists] and lookups by _id are flat.
//
// # Retention
//
// What only grows (finished jobs with their logs and progress, revocations, kite presence
// records, expired leases) is pruned by the Prune methods, which kloud runs on a schedule
// (kloud/retention.go: what stays, for how long, how often). A prune works in bounded batches,
// oldest first, each delete conditional on the record still qualifying, so one stopped midway
// (cancelled, or the process killed) leaves exactly the records it had not reached.
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
//	changelog    _id is the seq as 16 hex digits; what several replicas publish (changelog.go)
//
// # Repositories: the only way to the documents
//
// Every collection has a typed repository ([Jobs], [Keys], [Revocations], [Kites] and those of
// repos.go) whose methods are named after what kloud does (Stacks().TransitionOfJob,
// Machines().ByStack, Credentials().ClaimBootstrap…) and take and return the Go types of
// model.go. They are the only code that builds filters and updates; no other package imports
// the MongoDB driver, builds a bson.M or calls [Store.Collection] (a test in this package
// parses the module to keep it so). A test that must simulate a record an older kloud or a dead
// process left uses storetest.SetFields and storetest.Raw. The documents are defined once, in
// the leaf package kloud/model, shared with the wire contract (kloud/api); model.go here names
// them. This package imports neither kloud, kloud/api nor kite.
//
// # Errors
//
// Sentinels ([ErrNotFound], [ErrLocked], [ErrLeaseLost], [ErrConflict], [ErrState],
// [ErrClosed], [ErrJobCancelled]) are the store's own: it does not import kite. kloud maps them
// to kite's error codes in one place (kloud/errors.go, applied where handlers are dispatched).
// A conditional write whose condition no longer holds is not an error: the method reports
// false.
//
// # Time
//
// All times are stored as BSON dates (millisecond precision) in UTC, and lease and job expiry
// compare against the clock of the process that writes ([Options.Now]). Replicas sharing one
// MongoDB need clocks that agree to well within a lease TTL.
package store
