package store

import (
	"context"
	"fmt"

	"github.com/kloud-dev/kloud/kloud/model"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// Snapshots is the snapshots collection: kloud's records of machine disk snapshots (the data is
// the provider's). Indexed by owner and machineId.
type Snapshots struct{ s *Store }

// Snapshots returns the snapshots repository.
func (s *Store) Snapshots() *Snapshots { return &Snapshots{s} }

func (r *Snapshots) coll() *mongo.Collection { return r.s.db.Collection(CollSnapshots) }

// Insert adds a snapshot record (createdAt and updatedAt set now).
func (r *Snapshots) Insert(ctx context.Context, sn model.Snapshot) error {
	sn.CreatedAt = r.s.Now()
	sn.UpdatedAt = sn.CreatedAt
	return r.s.told(insert(ctx, r.coll(), "snapshot", sn.ID, sn), Change{Coll: CollSnapshots, ID: sn.ID})
}

// Get returns a snapshot record.
func (r *Snapshots) Get(ctx context.Context, id string) (model.Snapshot, error) {
	return findOne[model.Snapshot](ctx, r.coll(), "snapshot", id, bson.M{"_id": id})
}

// SnapshotFilter selects snapshots for [Snapshots.List]: those matching every non-empty field.
type SnapshotFilter struct {
	Owner     string
	MachineID string
}

// List returns the matching snapshots, oldest first.
func (r *Snapshots) List(ctx context.Context, f SnapshotFilter) ([]model.Snapshot, error) {
	filter := bson.M{}
	if f.Owner != "" {
		filter["owner"] = f.Owner
	}
	if f.MachineID != "" {
		filter["machineId"] = f.MachineID
	}
	out, err := findAll[model.Snapshot](ctx, r.coll(), filter, byCreation)
	if err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	return out, nil
}

// Usage returns how many snapshots owner has and the bytes they take (every status counts: a
// snapshot being made takes its place in the count).
func (r *Snapshots) Usage(ctx context.Context, owner string) (count int, bytes int64, err error) {
	all, err := r.List(ctx, SnapshotFilter{Owner: owner})
	if err != nil {
		return 0, 0, err
	}
	for _, sn := range all {
		bytes += sn.Size
	}
	return len(all), bytes, nil
}

// SnapshotSet is a change to a snapshot record; nil fields are left as they are.
type SnapshotSet struct {
	Status   *string
	Error    *string
	Size     *int64
	DiskSize *int64
	Format   *string
	JobID    *string
}

// Set changes a snapshot record if it is in one of from (empty: any status). It reports whether
// it was.
func (r *Snapshots) Set(ctx context.Context, id string, from []string, u SnapshotSet) (bool, error) {
	set := bson.M{"updatedAt": r.s.Now()}
	setIf(set, "status", u.Status)
	setIf(set, "error", u.Error)
	setIf(set, "size", u.Size)
	setIf(set, "diskSize", u.DiskSize)
	setIf(set, "format", u.Format)
	setIf(set, "jobId", u.JobID)
	filter := bson.M{"_id": id}
	if len(from) > 0 {
		filter["status"] = in(from)
	}
	return r.s.toldIf(update(ctx, r.coll(), "snapshot", id, filter, bson.M{"$set": set}))(Change{Coll: CollSnapshots, ID: id})
}

// Delete removes a snapshot record; a missing one wraps ErrNotFound.
func (r *Snapshots) Delete(ctx context.Context, id string) error {
	c := Change{Coll: CollSnapshots, ID: id, Deleted: true}
	if r.s.watched() {
		if sn, err := r.Get(ctx, id); err == nil {
			c.Gone = sn
		}
	}
	res, err := r.coll().DeleteOne(ctx, bson.M{"_id": id})
	if err != nil {
		return fmt.Errorf("delete snapshot %s: %w", id, err)
	}
	if res.DeletedCount == 0 {
		return fmt.Errorf("snapshot %s: %w", id, ErrNotFound)
	}
	r.s.changed(c)
	return nil
}
