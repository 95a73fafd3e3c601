package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// migration is one step of the schema. Steps run in order, each once, and record the new
// version after they succeed. A step must be idempotent: a crash after it ran but before the
// version was recorded runs it again.
type migration struct {
	version int
	name    string
	up      func(ctx context.Context, s *Store) error
}

// migrations is the schema history. Append only; never edit a released step.
var migrations = []migration{
	{1, "initial schema (collections and indexes are created by ensureIndexes)", func(context.Context, *Store) error { return nil }},
}

const (
	schemaID       = "schema"
	migrateLease   = "kloud/migrate"
	migrateLockTTL = 5 * time.Minute
)

// SchemaVersion returns the schema version recorded in the database (0 for a new database).
func (s *Store) SchemaVersion(ctx context.Context) (int, error) {
	var doc struct {
		Version int `bson:"version"`
	}
	err := s.Collection(CollMeta).FindOne(ctx, bson.M{"_id": schemaID}).Decode(&doc)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("schema version: %w", err)
	}
	return doc.Version, nil
}

// migrate runs the steps above the recorded version, holding a lease so that two replicas
// starting together do not migrate at once.
func (s *Store) migrate(ctx context.Context, steps []migration) (err error) {
	target := 0
	for i, m := range steps {
		if m.version != i+1 {
			return fmt.Errorf("migrate: step %d has version %d", i+1, m.version)
		}
		target = m.version
	}
	cur, err := s.SchemaVersion(ctx)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if cur > target {
		return fmt.Errorf("migrate: database schema version %d is newer than this kloud knows (%d); upgrade kloud", cur, target)
	}
	if cur == target {
		return nil
	}

	lease, err := s.waitLease(ctx, migrateLease, s.instance, migrateLockTTL)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer func() {
		if rerr := lease.Release(context.WithoutCancel(ctx)); rerr != nil && err == nil {
			err = fmt.Errorf("migrate: %w", rerr)
		}
	}()
	// Another replica may have migrated while we waited.
	if cur, err = s.SchemaVersion(ctx); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	for _, m := range steps[cur:] {
		s.log.Info("schema migration", "version", m.version, "name", m.name)
		if err := m.up(ctx, s); err != nil {
			return fmt.Errorf("migrate to version %d (%s): %w", m.version, m.name, err)
		}
		if _, err := s.Collection(CollMeta).UpdateOne(ctx, bson.M{"_id": schemaID},
			bson.M{"$set": bson.M{"version": m.version, "updatedAt": s.Now()}},
			options.UpdateOne().SetUpsert(true)); err != nil {
			return fmt.Errorf("migrate to version %d: record version: %w", m.version, err)
		}
		if err := lease.Renew(ctx, migrateLockTTL); err != nil {
			return fmt.Errorf("migrate: %w", err)
		}
	}
	return nil
}

// waitLease acquires a lease, polling every 200ms while someone else holds it, until ctx ends.
func (s *Store) waitLease(ctx context.Context, name, owner string, ttl time.Duration) (*Lease, error) {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		l, err := s.AcquireLease(ctx, name, owner, ttl)
		if err == nil {
			return l, nil
		}
		if !errors.Is(err, ErrLocked) {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for %w", err)
		case <-t.C:
		}
	}
}

// index is one index to create at start.
type index struct {
	coll   string
	keys   bson.D
	unique bool
}

// indexes lists what the obvious queries need. Creating an existing index is a no-op, so this
// runs at every start. FerretDB v1 only uses them to enforce uniqueness; MongoDB uses them all.
var indexes = []index{
	{CollUsers, bson.D{{Key: "username", Value: 1}}, true},
	{CollTeams, bson.D{{Key: "slug", Value: 1}}, true},
	{CollCredentials, bson.D{{Key: "owner", Value: 1}}, false},
	{CollCredentials, bson.D{{Key: "team", Value: 1}}, false},
	{CollTemplates, bson.D{{Key: "owner", Value: 1}}, false},
	{CollTemplates, bson.D{{Key: "team", Value: 1}}, false},
	{CollStacks, bson.D{{Key: "owner", Value: 1}}, false},
	{CollStacks, bson.D{{Key: "team", Value: 1}}, false},
	{CollStacks, bson.D{{Key: "templateId", Value: 1}}, false},
	{CollMachines, bson.D{{Key: "stackId", Value: 1}}, false},
	{CollMachines, bson.D{{Key: "kiteId", Value: 1}}, false},
	{CollMachines, bson.D{{Key: "owner", Value: 1}}, false},
	{CollJobs, bson.D{{Key: "target", Value: 1}, {Key: "createdAt", Value: -1}}, false},
	{CollJobs, bson.D{{Key: "owner", Value: 1}, {Key: "createdAt", Value: -1}}, false},
	{CollJobs, bson.D{{Key: "status", Value: 1}, {Key: "leaseUntil", Value: 1}}, false},
	{CollLocks, bson.D{{Key: "expiresAt", Value: 1}}, false},
	{CollKeys, bson.D{{Key: "createdAt", Value: 1}}, false},
	{CollRevocations, bson.D{{Key: "until", Value: 1}}, false},
	{CollKites, bson.D{{Key: "username", Value: 1}}, false},
	{CollKites, bson.D{{Key: "environment", Value: 1}}, false},
	{CollKites, bson.D{{Key: "name", Value: 1}}, false},
	{CollKites, bson.D{{Key: "version", Value: 1}}, false},
	{CollKites, bson.D{{Key: "region", Value: 1}}, false},
	{CollKites, bson.D{{Key: "hostname", Value: 1}}, false},
	{CollKites, bson.D{{Key: "replica", Value: 1}}, false},
	{CollKites, bson.D{{Key: "lastSeen", Value: 1}}, false},
	{CollReplicas, bson.D{{Key: "expiresAt", Value: 1}}, false},
	{CollPlugins, bson.D{{Key: "replica", Value: 1}}, false},
	{CollSessions, bson.D{{Key: "username", Value: 1}}, false},
	{CollSessions, bson.D{{Key: "expiresAt", Value: 1}}, false},
	{CollSnapshots, bson.D{{Key: "owner", Value: 1}}, false},
	{CollSnapshots, bson.D{{Key: "machineId", Value: 1}}, false},
	{CollAudit, bson.D{{Key: "time", Value: 1}}, false},
	{CollAudit, bson.D{{Key: "user", Value: 1}, {Key: "_id", Value: -1}}, false},
	{CollIdentities, bson.D{{Key: "username", Value: 1}}, false},
	{CollBuckets, bson.D{{Key: "stackId", Value: 1}}, false},
	{CollBuckets, bson.D{{Key: "owner", Value: 1}}, false},
	{CollAttempts, bson.D{{Key: "expiresAt", Value: 1}}, false},
	{CollPools, bson.D{{Key: "team", Value: 1}}, false},
	{CollStacks, bson.D{{Key: "pool", Value: 1}}, false},
}

func (s *Store) ensureIndexes(ctx context.Context) error {
	// One createIndexes call per index: FerretDB v1.24 panics on a call listing two or more
	// indexes that already exist (validateIndexesForCreation deletes from the slice it indexes).
	for _, ix := range indexes {
		m := mongo.IndexModel{Keys: ix.keys}
		if ix.unique {
			m.Options = options.Index().SetUnique(true)
		}
		if _, err := s.Collection(ix.coll).Indexes().CreateOne(ctx, m); err != nil {
			return fmt.Errorf("create index on %s: %w", ix.coll, err)
		}
	}
	// Collections without secondary indexes exist from the start too, so listing them works.
	have, err := s.db.ListCollectionNames(ctx, bson.M{})
	if err != nil {
		return fmt.Errorf("list collections: %w", err)
	}
	exists := map[string]bool{}
	for _, n := range have {
		exists[n] = true
	}
	for _, c := range []string{CollUsers, CollTeams, CollCredentials, CollTemplates, CollStacks, CollMachines,
		CollJobs, CollLocks, CollKeys, CollRevocations, CollKites, CollSessions, CollMeta, CollSnapshots, CollQuotas, CollAudit,
		CollIdentities, CollBuckets, CollAttempts, CollReplicas, CollPools, CollPlugins} {
		if exists[c] {
			continue
		}
		if err := s.db.CreateCollection(ctx, c); err != nil && !isNamespaceExists(err) {
			return fmt.Errorf("create collection %s: %w", c, err)
		}
	}
	return nil
}

// isNamespaceExists reports the error of creating a collection that another replica created
// a moment ago (code 48).
func isNamespaceExists(err error) bool {
	var ce mongo.CommandError
	return errors.As(err, &ce) && ce.Code == 48
}
