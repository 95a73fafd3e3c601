package store

import (
	"context"
	"crypto/cipher"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Collection names. They are fixed. Other packages reach the documents through the typed
// repositories; the names are exported for tests that simulate old records (storetest).
const (
	CollUsers       = "users"
	CollTeams       = "teams"
	CollCredentials = "credentials"
	CollTemplates   = "templates"
	CollStacks      = "stacks"
	CollMachines    = "machines"
	CollJobs        = "jobs"
	CollLocks       = "locks"
	CollKeys        = "keys"
	CollRevocations = "revocations"
	CollKites       = "kites"
	CollSessions    = "sessions"
	CollMeta        = "meta"
	CollSnapshots   = "snapshots"  // snapshots.go
	CollQuotas      = "quotas"     // quotas.go
	CollAudit       = "audit"      // audit.go
	CollIdentities  = "identities" // identities.go: single sign-on subjects → users
	CollBuckets     = "buckets"    // buckets.go: stacks' bucket claims
	CollAttempts    = "attempts"   // attempts.go: failed logins per user and address, for every replica
	CollPools       = "pools"      // pools.go: prebuilt stacks' pools
)

// Options configure [Open]. Zero fields take the documented defaults.
type Options struct {
	// MongoURL is a mongodb:// URL. Empty means: start the embedded FerretDB in DataDir/db/.
	// It must be a real MongoDB (a replica set when several kloud replicas share it) or
	// `kloud store serve` (kloud/store/storeserve), which serialises its clients' commands. A
	// plain FerretDB v1 behind it is only correct with a single client using ?maxPoolSize=1.
	MongoURL string
	// DataDir holds the embedded database (DataDir/db/) and, unless SecretKey is set, the
	// secret key (DataDir/secret.key). Created with mode 0700 if missing. Required unless
	// MongoURL and SecretKey are both set.
	DataDir string
	// Database is the database name. Default "kloud".
	Database string
	// SecretKey is the 32-byte AES-256 key for [Store.Seal]. Default: read DataDir/secret.key,
	// creating it (32 random bytes, mode 0600) if missing. Replicas sharing one MongoDB must
	// use the same key; Open refuses a key that does not match the database.
	SecretKey []byte
	// Logger receives the store's logs and FerretDB's warnings and errors. Default: discard.
	Logger *slog.Logger
	// Now is the clock for timestamps, lease and job expiry. Default time.Now.
	Now func() time.Time
	// JobPollInterval is how often [Jobs.Watch] re-reads a job, to see changes made by another
	// process. Default 500ms.
	JobPollInterval time.Duration
	// JobLogLines is how many log lines a job keeps (the last ones). Default 500.
	JobLogLines int
	// ServerSelectionTimeout bounds how long an operation waits for a database that does not
	// answer before it fails with an error [IsUnavailable] recognises; it is also the timeout of
	// a new connection. The driver counts the wait for a free connection of its pool in it too,
	// so where every operation queues for one connection it must outlast a burst of calls.
	// Default: DefaultServerSelectionTimeout (1.5s; the driver's own is 30s) for a MongoURL, so
	// a call fails fast and clearly while the store is down (with maxPoolSize=1, a FerretDB v1,
	// raise it with serverSelectionTimeoutMS in the URL if calls queue longer under load);
	// EmbeddedServerSelectionTimeout (30s) for the embedded store, which runs in this process
	// and cannot be unreachable, only busy. A serverSelectionTimeoutMS or connectTimeoutMS in
	// MongoURL wins.
	ServerSelectionTimeout time.Duration
	// JobLeaseTTL is how long a job's runner lease lasts without a heartbeat, progress or log
	// line. Default 30s.
	JobLeaseTTL time.Duration
	// OnCommand, if set, is told of every database command the driver finished: its name
	// (find, update, insert, ...), how long it took and whether it failed (the driver's command
	// monitor; kloud's store latency metrics). It must not block.
	OnCommand func(name string, d time.Duration, failed bool)
	// OnChange, if set, is told of every write to a machine, stack, job, snapshot or bucket
	// claim this store made, after it succeeded ([Change]; kloud's event hub). It is called on
	// the writer's goroutine and must not block or call the store.
	OnChange func(Change)
}

// Store is an open store. Its methods are safe for concurrent use.
type Store struct {
	opts     Options
	log      *slog.Logger
	now      func() time.Time
	instance string // "<instance>.<boot>": this process (instance.go)
	// instancePrefix is "<instance>.": the holders of this instance's processes.
	instancePrefix  string
	releaseInstance func() // unlocks DataDir/instance.id (nil: none held)

	client   *mongo.Client
	db       *mongo.Database
	aead     cipher.AEAD
	embedded *embedded // nil with MongoURL

	jobs *Jobs

	// wmu serialises the store's conditional writes on the embedded backend (see lockWrites).
	wmu sync.Mutex
	// auditSem lets one of this store's audit appends race for the next seq at a time (the
	// others wait here instead of retrying against each other); replicas still race.
	auditSem chan struct{}

	closeOnce sync.Once
	closed    chan struct{}
	closeErr  error
}

// Open connects to MongoDB or starts the embedded FerretDB, checks the secret key against the
// database, runs pending migrations and creates indexes. Cancelling ctx aborts the start; the
// store itself lives until [Store.Close].
func Open(ctx context.Context, opts Options) (_ *Store, err error) {
	if opts.Database == "" {
		opts.Database = "kloud"
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.JobPollInterval <= 0 {
		opts.JobPollInterval = 500 * time.Millisecond
	}
	if opts.JobLogLines <= 0 {
		opts.JobLogLines = 500
	}
	if opts.JobLeaseTTL <= 0 {
		opts.JobLeaseTTL = 30 * time.Second
	}
	if opts.ServerSelectionTimeout <= 0 {
		opts.ServerSelectionTimeout = defaultSelectionTimeout(opts.MongoURL)
	}
	if opts.DataDir == "" && (opts.MongoURL == "" || opts.SecretKey == nil) {
		return nil, errors.New("open store: DataDir is required unless MongoURL and SecretKey are both set")
	}
	s := &Store{
		opts:     opts,
		log:      opts.Logger,
		now:      opts.Now,
		closed:   make(chan struct{}),
		auditSem: make(chan struct{}, 1),
	}
	defer func() {
		if err != nil {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			_ = s.Close(cctx)
		}
	}()

	inst := NewID()
	if opts.DataDir != "" {
		id, release, ierr := claimInstance(opts.DataDir)
		if ierr != nil {
			s.log.Warn("no persistent instance id: a restart waits out this process's leases", "err", ierr)
		} else {
			inst, s.releaseInstance = id, release
		}
	}
	s.instancePrefix = inst + "."
	s.instance = s.instancePrefix + NewID()

	key := opts.SecretKey
	if key == nil {
		if key, err = loadOrCreateKey(opts.DataDir); err != nil {
			return nil, fmt.Errorf("open store: %w", err)
		}
	}
	if s.aead, err = newAEAD(key); err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}

	copts := options.Client().
		SetAppName("kloud").
		SetBSONOptions(&options.BSONOptions{DefaultDocumentM: true}).
		SetServerSelectionTimeout(opts.ServerSelectionTimeout).
		SetConnectTimeout(opts.ServerSelectionTimeout)
	if f := opts.OnCommand; f != nil {
		copts.SetMonitor(&event.CommandMonitor{
			Succeeded: func(_ context.Context, e *event.CommandSucceededEvent) { f(e.CommandName, e.Duration, false) },
			Failed:    func(_ context.Context, e *event.CommandFailedEvent) { f(e.CommandName, e.Duration, true) },
		})
	}
	if opts.MongoURL != "" {
		copts.ApplyURI(opts.MongoURL)
	} else {
		if s.embedded, err = startEmbedded(opts.DataDir, s.log); err != nil {
			return nil, fmt.Errorf("open store: %w", err)
		}
		// One connection: FerretDB v1 then handles our requests one at a time, which makes
		// conditional single-document updates atomic (see the package doc).
		copts.ApplyURI(s.embedded.uri).SetMaxPoolSize(1).SetMaxConnecting(1)
	}
	if s.client, err = mongo.Connect(copts); err != nil {
		return nil, fmt.Errorf("open store: connect: %w", err)
	}
	if err = s.client.Ping(ctx, nil); err != nil {
		if IsUnavailable(err) {
			err = fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		return nil, fmt.Errorf("open store: ping: %w", err)
	}
	s.db = s.client.Database(opts.Database)
	s.jobs = newJobs(s)

	if err = s.checkKey(ctx); err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	if err = s.migrate(ctx, migrations); err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	if err = s.ensureIndexes(ctx); err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	if s.embedded != nil {
		// Every collection exists by now (ensureIndexes), so each gets its _id index.
		if err = s.embedded.indexIDs(ctx, opts.Database); err != nil {
			return nil, fmt.Errorf("open store: %w", err)
		}
	}
	s.log.Info("store open", "embedded", s.embedded != nil, "database", opts.Database)
	return s, nil
}

// Close disconnects and, for the embedded store, stops FerretDB and releases the data
// directory. Watches end. Calling Close again returns the first result.
func (s *Store) Close(ctx context.Context) error {
	s.closeOnce.Do(func() {
		close(s.closed)
		var errs []error
		if s.client != nil {
			if err := s.client.Disconnect(ctx); err != nil {
				errs = append(errs, fmt.Errorf("disconnect: %w", err))
			}
		}
		if s.embedded != nil {
			if err := s.embedded.stop(ctx); err != nil {
				errs = append(errs, err)
			}
		}
		if s.releaseInstance != nil {
			s.releaseInstance()
		}
		if err := errors.Join(errs...); err != nil {
			s.closeErr = fmt.Errorf("close store: %w", err)
		}
	})
	return s.closeErr
}

// The defaults of [Options.ServerSelectionTimeout]: a MongoURL, the embedded store.
const (
	DefaultServerSelectionTimeout  = 1500 * time.Millisecond
	EmbeddedServerSelectionTimeout = 30 * time.Second
)

// defaultSelectionTimeout is the server selection timeout for mongoURL (see
// Options.ServerSelectionTimeout). The driver counts the wait for the pool's connection in it:
// the embedded store's one connection, queued for by every call, waited more than 1.5s under
// a loaded machine (CI), and the embedded store cannot be unreachable.
func defaultSelectionTimeout(mongoURL string) time.Duration {
	if mongoURL == "" {
		return EmbeddedServerSelectionTimeout
	}
	return DefaultServerSelectionTimeout
}

// Ping checks that the database answers: nil, or an error wrapping [ErrUnavailable] (with the
// driver's cause) when it does not, [ErrClosed] once the store is closed. It waits at most
// Options.ServerSelectionTimeout (less if ctx ends first).
func (s *Store) Ping(ctx context.Context) error {
	select {
	case <-s.closed:
		return fmt.Errorf("ping: %w", ErrClosed)
	default:
	}
	if err := s.client.Ping(ctx, nil); err != nil {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return nil
}

// Collection returns the named collection (one of the Coll* constants). It is for this package,
// its tests and storetest: everything else uses the typed repositories (see the package doc).
func (s *Store) Collection(name string) *mongo.Collection { return s.db.Collection(name) }

// Database returns the store's database, for this package's tests and storetest.
func (s *Store) Database() *mongo.Database { return s.db }

// Embedded reports whether the store runs the embedded FerretDB (no MongoURL).
func (s *Store) Embedded() bool { return s.embedded != nil }

// InstanceID identifies this store (and so this kloud process) as a job runner, lease holder or
// replica name: "<instance>.<boot>", the instance id persisted in the data directory (random
// without one) and a boot id new at every Open (see instance.go).
func (s *Store) InstanceID() string { return s.instance }

// Now returns the store's clock reading, truncated to the millisecond precision of BSON dates.
func (s *Store) Now() time.Time { return s.now().UTC().Truncate(time.Millisecond) }

// Jobs returns the durable jobs API.
func (s *Store) Jobs() *Jobs { return s.jobs }

// lockWrites takes the store's write lock on the embedded backend and returns its unlock (a
// no-op on MongoDB). FerretDB v1 pushes only a filter that is exactly {_id: x} down to SQLite
// and scans the whole collection in Go for anything else, so a conditional update such as
// {_id: x, status: "running"} costs time in proportion to the collection's size. On the embedded
// backend [Jobs] therefore does a conditional write as a read by _id, the condition checked in
// Go, and a write by _id, with this lock held across the three: every write of the jobs
// collection is made by Jobs and takes it, so no write can slip between the read and the
// write, and the conditional write stays atomic. On MongoDB the condition stays in the filter
// (one atomic command, served by indexes).
func (s *Store) lockWrites() (unlock func()) {
	if s.embedded == nil {
		return func() {}
	}
	s.wmu.Lock()
	return s.wmu.Unlock
}

// Exists reports whether coll has a document with _id id (one lookup by _id, which every
// backend answers without a scan).
func (s *Store) Exists(ctx context.Context, coll, id string) (bool, error) {
	err := s.Collection(coll).FindOne(ctx, bson.M{"_id": id}, options.FindOne().SetProjection(bson.M{"_id": 1})).Err()
	if errors.Is(err, mongo.ErrNoDocuments) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("look up %s %q: %w", coll, id, err)
	}
	return true, nil
}

// NewID returns a new document id: 24 hex digits, a BSON ObjectID in string form, so ids
// sort by creation time and lookups by _id are pushed down on FerretDB.
func NewID() string { return bson.NewObjectID().Hex() }
