package store

import (
	"context"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/kloud-dev/kloud/provider"
)

// AddPorts adds rules (normalized) to a machine's recorded firewall rules, each once, in one
// atomic update; PortRule values are compared whole.
func (r *Machines) AddPorts(ctx context.Context, id string, rules []provider.PortRule) error {
	if len(rules) == 0 {
		return nil
	}
	return r.s.told(updateByID(ctx, r.coll(), "machine", id, bson.M{
		"$addToSet": bson.M{"ports": bson.M{"$each": rules}},
		"$set":      bson.M{"updatedAt": r.s.Now()},
	}), Change{Coll: CollMachines, ID: id})
}

// RemovePorts removes rules from a machine's recorded firewall rules in one atomic update
// ($pullAll: whole values; $pull with $in does not match documents in the embedded store).
func (r *Machines) RemovePorts(ctx context.Context, id string, rules []provider.PortRule) error {
	if len(rules) == 0 {
		return nil
	}
	return r.s.told(updateByID(ctx, r.coll(), "machine", id, bson.M{
		"$pullAll": bson.M{"ports": rules},
		"$set":     bson.M{"updatedAt": r.s.Now()},
	}), Change{Coll: CollMachines, ID: id})
}
