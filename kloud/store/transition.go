package store

import (
	"context"
	"errors"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// StateField is the document field that [Store.Transition] compares and that stacks and
// machines keep their state in.
const StateField = "state"

// Transition changes one document from one of the states in from, with a single UpdateOne
// whose filter is {_id: id, state: {$in: from}} and whose update is {$set: set}. It reports
// whether the document was in one of those states and so was changed; false means it does
// not exist or is in another state (read it to tell which). Among concurrent callers, at most
// one transition out of a given state applies. set normally includes the new "state"; if it
// has no "updatedAt", Transition sets it to the store's clock.
func (s *Store) Transition(ctx context.Context, coll string, id any, from []string, set bson.M) (bool, error) {
	return s.TransitionIf(ctx, coll, id, from, nil, set)
}

// TransitionIf is [Store.Transition] with more conditions: the filter also holds every field
// of match (e.g. {"jobId": j} to change a stack only if it still belongs to job j, or
// {"updatedAt": t} to change a document only if nobody changed it since it was read). match
// must not name _id or state.
func (s *Store) TransitionIf(ctx context.Context, coll string, id any, from []string, match, set bson.M) (bool, error) {
	if len(from) == 0 {
		return false, errors.New("transition: no from states")
	}
	upd := make(bson.M, len(set)+1)
	for k, v := range set {
		upd[k] = v
	}
	if _, ok := upd["updatedAt"]; !ok {
		upd["updatedAt"] = s.Now()
	}
	filter := bson.M{"_id": id, StateField: bson.M{"$in": from}}
	for k, v := range match {
		if k == "_id" || k == StateField {
			return false, fmt.Errorf("transition: match may not name %q", k)
		}
		filter[k] = v
	}
	res, err := s.Collection(coll).UpdateOne(ctx, filter, bson.M{"$set": upd})
	if err != nil {
		return false, fmt.Errorf("transition %s %v: %w", coll, id, err)
	}
	return res.MatchedCount == 1, nil
}
