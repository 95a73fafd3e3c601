package store

import (
	"context"
	"fmt"

	"github.com/kloud-dev/kloud/kloud/model"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// What stack.update (kloud/stacks_update.go) writes: a stack's new files and machine list, the
// machines' sealed agent configurations, and the removal of machines an update took away.

// StackContent is what a stack is made of, as stack.update changes it: its files, the template
// revision they are from (or were scaled from, Diverged), its variables and its machine ids.
// Nil or zero fields are written too: the caller passes the whole content.
type StackContent struct {
	Files     []model.File
	Rev       int
	Diverged  bool
	Variables map[string]string
	Machines  []string
}

// SetContent replaces a stack's files, revision, variables and machine list, if the stack is
// still the job's (its jobId is jobID). It reports whether it did.
func (r *Stacks) SetContent(ctx context.Context, id, jobID string, c StackContent) (bool, error) {
	if c.Machines == nil {
		c.Machines = []string{}
	}
	set := bson.M{"files": c.Files, "templateRev": c.Rev, "diverged": c.Diverged, "machines": c.Machines, "updatedAt": r.s.Now()}
	upd := bson.M{"$set": set}
	if len(c.Variables) > 0 {
		set["variables"] = c.Variables
	} else {
		upd["$unset"] = bson.M{"variables": ""}
	}
	return r.s.toldIf(update(ctx, r.coll(), "stack", id, bson.M{"_id": id, "jobId": jobMatch(jobID)}, upd))(Change{Coll: CollStacks, ID: id})
}

// SetAgentSealed records each machine's sealed agent configuration (machine id → sealed bytes)
// in one write. A machine that does not exist is ErrNotFound; the others are written.
func (r *Machines) SetAgentSealed(ctx context.Context, sealed map[string][]byte) error {
	if len(sealed) == 0 {
		return nil
	}
	now := r.s.Now()
	models := make([]mongo.WriteModel, 0, len(sealed))
	for id, b := range sealed {
		models = append(models, mongo.NewUpdateOneModel().SetFilter(bson.M{"_id": id}).
			SetUpdate(bson.M{"$set": bson.M{"agentSealed": b, "updatedAt": now}}))
	}
	res, err := r.coll().BulkWrite(ctx, models, options.BulkWrite().SetOrdered(false))
	if err != nil {
		return fmt.Errorf("record agent configurations of %d machines: %w", len(sealed), err)
	}
	if res.MatchedCount != int64(len(sealed)) {
		return fmt.Errorf("record agent configurations: %d of %d machines: %w", len(sealed)-int(res.MatchedCount), len(sealed), ErrNotFound)
	}
	return nil
}

// DeleteOfStack removes the machines ids of stack stackID (ids of other stacks are left alone;
// missing ones are not an error).
func (r *Machines) DeleteOfStack(ctx context.Context, stackID string, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	gone := r.machinesBefore(ctx, stackID, ids...)
	if _, err := r.coll().DeleteMany(ctx, bson.M{"stackId": stackID, "_id": bson.M{"$in": ids}}); err != nil {
		return fmt.Errorf("delete %d machines of stack %s: %w", len(ids), stackID, err)
	}
	r.s.changed(Change{Coll: CollMachines, StackID: stackID, Deleted: true, Gone: gone})
	return nil
}
