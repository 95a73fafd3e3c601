package store

import (
	"context"
	"time"

	"github.com/kloud-dev/kloud/kloud/model"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// Idle stop (kloud/idle.go): a machine's idle settings and its countdown live in the machine's
// "idle" field. These writes leave updatedAt alone: activity is not a change of the machine
// that the optimistic updates keyed on updatedAt (shares) should conflict with.

// SetIdleSettings replaces machine id's own idle settings. A changed timeout restarts the
// countdown (the deadline is cleared; kloud's idle task sets a new one).
func (r *Machines) SetIdleSettings(ctx context.Context, id string, s model.IdleSettings) error {
	set, unset := bson.M{}, bson.M{"idle.deadline": ""}
	if s.TimeoutSeconds != nil {
		set["idle.timeoutSec"] = *s.TimeoutSeconds
	} else {
		unset["idle.timeoutSec"] = ""
	}
	if s.AlwaysOn != nil {
		set["idle.alwaysOn"] = *s.AlwaysOn
	} else {
		unset["idle.alwaysOn"] = ""
	}
	upd := bson.M{"$unset": unset}
	if len(set) > 0 {
		upd["$set"] = set
	}
	return r.s.told(updateByID(ctx, r.coll(), "machine", id, upd), Change{Coll: CollMachines, ID: id})
}

// SetIdleCountdown records machine id's last activity (or the countdown's start) and its
// deadline (zero: no countdown), if the machine is still in state and its recorded last
// activity is not newer than lastActivity (a slower writer never moves it back). It reports
// whether it wrote.
func (r *Machines) SetIdleCountdown(ctx context.Context, id, state string, lastActivity, deadline time.Time) (bool, error) {
	filter := bson.M{"_id": id, StateField: state, "$or": []bson.M{
		{"idle.lastActivity": bson.M{"$exists": false}},
		{"idle.lastActivity": bson.M{"$lte": lastActivity}},
	}}
	set, unset := bson.M{}, bson.M{}
	if lastActivity.IsZero() {
		unset["idle.lastActivity"] = ""
	} else {
		set["idle.lastActivity"] = lastActivity
	}
	if deadline.IsZero() {
		unset["idle.deadline"] = ""
	} else {
		set["idle.deadline"] = deadline
	}
	upd := bson.M{}
	if len(set) > 0 {
		upd["$set"] = set
	}
	if len(unset) > 0 {
		upd["$unset"] = unset
	}
	return r.s.toldIf(update(ctx, r.coll(), "machine", id, filter, upd))(Change{Coll: CollMachines, ID: id, Field: "idle"})
}

// ResetIdleCountdown starts machine id's countdown afresh from at (machine.start): its last
// activity is at, its deadline cleared (kloud's idle task sets it).
func (r *Machines) ResetIdleCountdown(ctx context.Context, id string, at time.Time) error {
	return r.s.told(updateByID(ctx, r.coll(), "machine", id, bson.M{"$set": bson.M{"idle.lastActivity": at}, "$unset": bson.M{"idle.deadline": ""}}),
		Change{Coll: CollMachines, ID: id, Field: "idle"})
}

// SetIdle replaces template id's idle settings (zero: inherit kloud's).
func (r *Templates) SetIdle(ctx context.Context, id string, s model.IdleSettings) error {
	upd := bson.M{"$set": bson.M{"idle": s}}
	if s == (model.IdleSettings{}) {
		upd = bson.M{"$unset": bson.M{"idle": ""}}
	}
	return updateByID(ctx, r.coll(), "template", id, upd)
}

// SetAutostart replaces machine id's start schedule (nil: none).
func (r *Machines) SetAutostart(ctx context.Context, id string, a *model.Autostart) error {
	upd := bson.M{"$set": bson.M{"autostart": a}}
	if a == nil {
		upd = bson.M{"$unset": bson.M{"autostart": ""}}
	}
	return r.s.told(updateByID(ctx, r.coll(), "machine", id, upd), Change{Coll: CollMachines, ID: id})
}

// AutostartDue returns the machines whose next scheduled start is at or before now.
func (r *Machines) AutostartDue(ctx context.Context, now time.Time) ([]model.Machine, error) {
	return findAll[model.Machine](ctx, r.coll(), bson.M{"autostart.next": bson.M{"$lte": now}})
}

// SetAutostartNext moves machine id's next scheduled start from prev to next, if it is still
// prev (another kloud did not move it first). It reports whether it did.
func (r *Machines) SetAutostartNext(ctx context.Context, id string, prev, next time.Time) (bool, error) {
	return update(ctx, r.coll(), "machine", id, bson.M{"_id": id, "autostart.next": prev}, bson.M{"$set": bson.M{"autostart.next": next}})
}
