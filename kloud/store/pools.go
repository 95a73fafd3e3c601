package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/kloud-dev/kloud/kloud/model"
)

// Pools is the pools collection: administrators' orders for prebuilt stacks (model.Pool). The
// pool's stacks are ordinary stacks owned by model.PoolOwner with Stack.Pool set; a user's
// stack.create claims one with [Stacks.Claim].
type Pools struct{ s *Store }

// Pools returns the pools repository.
func (s *Store) Pools() *Pools { return &Pools{s} }

func (r *Pools) coll() *mongo.Collection { return r.s.db.Collection(CollPools) }

// Get returns a pool; none wraps ErrNotFound.
func (r *Pools) Get(ctx context.Context, id string) (model.Pool, error) {
	return findOne[model.Pool](ctx, r.coll(), "pool", id, bson.M{"_id": id})
}

// Set creates or replaces a pool (one atomic upsert; updatedAt set now).
func (r *Pools) Set(ctx context.Context, p model.Pool) error {
	p.UpdatedAt = r.s.Now()
	if _, err := r.coll().ReplaceOne(ctx, bson.M{"_id": p.ID}, p, options.Replace().SetUpsert(true)); err != nil {
		return fmt.Errorf("set pool %s: %w", p.ID, err)
	}
	return nil
}

// SetProblem records what keeps pool id from its size ("": nothing), for pool.list.
func (r *Pools) SetProblem(ctx context.Context, id, problem string) error {
	if _, err := r.coll().UpdateOne(ctx, bson.M{"_id": id}, bson.M{"$set": bson.M{"problem": problem}}); err != nil {
		return fmt.Errorf("pool %s: %w", id, err)
	}
	return nil
}

// List returns the pools of team ("": every team's), by id.
func (r *Pools) List(ctx context.Context, team string) ([]model.Pool, error) {
	filter := bson.M{}
	if team != "" {
		filter["team"] = team
	}
	ps, err := findAll[model.Pool](ctx, r.coll(), filter, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		return nil, fmt.Errorf("list pools: %w", err)
	}
	return ps, nil
}

// Delete removes a pool (a missing one is not an error). Its stacks stay, for the reconciler to
// destroy the unclaimed ones.
func (r *Pools) Delete(ctx context.Context, id string) error {
	if _, err := r.coll().DeleteOne(ctx, bson.M{"_id": id}); err != nil {
		return fmt.Errorf("delete pool %s: %w", id, err)
	}
	return nil
}

// Claim hands one built, idle stack of pool at template revision rev to owner in one atomic
// update (FindOneAndUpdate: of any number of concurrent claims, on any number of replicas, each
// stack goes to exactly one): the oldest stack owned by model.PoolOwner with that pool and
// revision, Initialized (built, and no job changing it: a stack keeps its last job's id), gets
// owner, claimedAt, the id of the job that will hand its machines over (jobID: the job is
// created after, and a claim whose job never was is found by that id) and, if not empty, title.
// It returns the stack as claimed, or false if the pool has none ready. The machines follow
// with [Machines.SetOwner].
func (r *Stacks) Claim(ctx context.Context, pool string, rev int, owner, title, jobID string) (model.Stack, bool, error) {
	now := r.s.Now()
	set := bson.M{"owner": owner, "claimedAt": now, "updatedAt": now, "jobId": jobID}
	if title != "" {
		set["title"] = title
	}
	filter := bson.M{"pool": pool, "owner": model.PoolOwner, "templateRev": rev, StateField: model.StackInitialized}
	var st model.Stack
	err := r.coll().FindOneAndUpdate(ctx, filter, bson.M{"$set": set},
		options.FindOneAndUpdate().SetSort(bson.D{{Key: "createdAt", Value: 1}}).SetReturnDocument(options.After)).Decode(&st)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return model.Stack{}, false, nil
	}
	if err != nil {
		return model.Stack{}, false, fmt.Errorf("claim a stack of pool %s: %w", pool, err)
	}
	r.s.changed(Change{Coll: CollStacks, ID: st.ID})
	return st, true, nil
}

// ClaimedSince returns the stacks users claimed from any pool since t, oldest first.
func (r *Stacks) ClaimedSince(ctx context.Context, t time.Time) ([]model.Stack, error) {
	return findAll[model.Stack](ctx, r.coll(), bson.M{"pool": bson.M{"$nin": bson.A{nil, ""}}, "owner": bson.M{"$ne": model.PoolOwner},
		"claimedAt": bson.M{"$gte": t}}, byCreation)
}

// OfPool returns the stacks built for pool that are still the pool's (owned by
// model.PoolOwner), oldest first.
func (r *Stacks) OfPool(ctx context.Context, pool string) ([]model.Stack, error) {
	return findAll[model.Stack](ctx, r.coll(), bson.M{"pool": pool, "owner": model.PoolOwner}, byCreation)
}

// Pooled returns every stack of any pool that is still its pool's (owned by model.PoolOwner).
func (r *Stacks) Pooled(ctx context.Context) ([]model.Stack, error) {
	return findAll[model.Stack](ctx, r.coll(), bson.M{"pool": bson.M{"$nin": bson.A{nil, ""}}, "owner": model.PoolOwner}, byCreation)
}

// CountClaimed counts the stacks built for pool that users claimed.
func (r *Stacks) CountClaimed(ctx context.Context, pool string) (int, error) {
	n, err := r.coll().CountDocuments(ctx, bson.M{"pool": pool, "owner": bson.M{"$ne": model.PoolOwner}})
	if err != nil {
		return 0, fmt.Errorf("count the claimed stacks of pool %s: %w", pool, err)
	}
	return int(n), nil
}

// SetOwner gives every machine of stack stackID to owner (a claimed pool stack's).
func (r *Machines) SetOwner(ctx context.Context, stackID, owner string) error {
	if _, err := r.coll().UpdateMany(ctx, bson.M{"stackId": stackID}, bson.M{"$set": bson.M{"owner": owner, "updatedAt": r.s.Now()}}); err != nil {
		return fmt.Errorf("give the machines of stack %s to %s: %w", stackID, owner, err)
	}
	r.s.changed(Change{Coll: CollMachines, StackID: stackID})
	return nil
}

// SetHandover records the agent key a claimed pool stack's machine is being handed over with
// (its kite id and sealed configuration), unless one is recorded already. It reports whether it
// recorded this one.
func (r *Machines) SetHandover(ctx context.Context, id, kiteID string, sealed []byte) (bool, error) {
	return r.s.toldIf(update(ctx, r.coll(), "machine", id, bson.M{"_id": id, "handoverKiteId": bson.M{"$in": bson.A{nil, ""}}},
		bson.M{"$set": bson.M{"handoverKiteId": kiteID, "handoverSealed": sealed, "updatedAt": r.s.Now()}}))(Change{Coll: CollMachines, ID: id})
}

// FinishHandover makes the recorded handover's kite id the machine's agent and clears the
// handover, if it is still kiteID's. It reports whether it did. The machine's agentSealed stays
// the configuration it was built with (the pool's): an update renders the machine as it was
// built, so its user data, and the machine, do not change; its agent keeps its owner's key.
func (r *Machines) FinishHandover(ctx context.Context, id, kiteID string) (bool, error) {
	return r.s.toldIf(update(ctx, r.coll(), "machine", id, bson.M{"_id": id, "handoverKiteId": kiteID},
		bson.M{"$set": bson.M{"kiteId": kiteID, "updatedAt": r.s.Now()},
			"$unset": bson.M{"handoverKiteId": "", "handoverSealed": ""}}))(Change{Coll: CollMachines, ID: id, Field: "agent"})
}
