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

// The typed repositories of kloud's own documents (model.go): one type per collection, with
// methods named after what kloud does with it. They are the only code that builds filters and
// updates for these collections; kloud never touches a collection directly. Errors: a missing
// document wraps [ErrNotFound], a duplicate id or unique key [ErrConflict]; a conditional write
// whose condition no longer holds returns false (nothing changed), not an error.

// findAll returns every document of coll matching filter, decoded (an empty, non-nil slice if
// none match).
func findAll[T any](ctx context.Context, coll *mongo.Collection, filter any, opts ...options.Lister[options.FindOptions]) ([]T, error) {
	cur, err := coll.Find(ctx, filter, opts...)
	if err != nil {
		return nil, err
	}
	out := []T{}
	if err := cur.All(ctx, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// findOne decodes the document matching filter; a missing one wraps ErrNotFound.
func findOne[T any](ctx context.Context, coll *mongo.Collection, kind string, id any, filter any) (T, error) {
	var v T
	err := coll.FindOne(ctx, filter).Decode(&v)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return v, fmt.Errorf("%s %v: %w", kind, id, ErrNotFound)
	}
	if err != nil {
		return v, fmt.Errorf("load %s %v: %w", kind, id, err)
	}
	return v, nil
}

// insert inserts doc; a duplicate id or unique key wraps ErrConflict.
func insert(ctx context.Context, coll *mongo.Collection, kind string, id any, doc any) error {
	if _, err := coll.InsertOne(ctx, doc); err != nil {
		if IsDuplicateKey(err) {
			return fmt.Errorf("%s %v: %w", kind, id, ErrConflict)
		}
		return fmt.Errorf("insert %s %v: %w", kind, id, err)
	}
	return nil
}

// update runs one UpdateOne and reports whether a document matched.
func update(ctx context.Context, coll *mongo.Collection, kind string, id any, filter, upd any) (bool, error) {
	res, err := coll.UpdateOne(ctx, filter, upd)
	if err != nil {
		return false, fmt.Errorf("update %s %v: %w", kind, id, err)
	}
	return res.MatchedCount == 1, nil
}

// updateByID updates the document with this id; a missing one wraps ErrNotFound.
func updateByID(ctx context.Context, coll *mongo.Collection, kind string, id any, upd any) error {
	ok, err := update(ctx, coll, kind, id, bson.M{"_id": id}, upd)
	if err == nil && !ok {
		err = fmt.Errorf("%s %v: %w", kind, id, ErrNotFound)
	}
	return err
}

var byCreation = options.Find().SetSort(bson.D{{Key: "createdAt", Value: 1}})

// in matches any of vs (an empty list matches nothing).
func in[T any](vs []T) bson.M {
	if vs == nil {
		vs = []T{}
	}
	return bson.M{"$in": vs}
}

// ---- users

// Users is the users collection (_id = username).
type Users struct{ s *Store }

// Users returns the users repository.
func (s *Store) Users() *Users { return &Users{s} }

func (r *Users) coll() *mongo.Collection { return r.s.db.Collection(CollUsers) }

// Get returns a user.
func (r *Users) Get(ctx context.Context, username string) (model.User, error) {
	return findOne[model.User](ctx, r.coll(), "user", username, bson.M{"_id": username})
}

// Exists reports whether a user document exists.
func (r *Users) Exists(ctx context.Context, username string) (bool, error) {
	n, err := r.coll().CountDocuments(ctx, bson.M{"_id": username})
	if err != nil {
		return false, fmt.Errorf("look up user %s: %w", username, err)
	}
	return n > 0, nil
}

// Insert adds a user.
func (r *Users) Insert(ctx context.Context, u model.User) error {
	return insert(ctx, r.coll(), "user", u.Username, u)
}

// List returns every user.
func (r *Users) List(ctx context.Context) ([]model.User, error) {
	return findAll[model.User](ctx, r.coll(), bson.M{})
}

// Named returns the users among names that exist.
func (r *Users) Named(ctx context.Context, names []string) ([]model.User, error) {
	return findAll[model.User](ctx, r.coll(), bson.M{"_id": in(names)})
}

// SetPassword sets a user's password hash. With create, a missing user is created as a kloud
// administrator (the built-in admin has no document until its password is set).
func (r *Users) SetPassword(ctx context.Context, username, hash string, create bool) error {
	upd := bson.M{"$set": bson.M{"passwordHash": hash}}
	var opts []options.Lister[options.UpdateOneOptions]
	if create {
		upd["$setOnInsert"] = bson.M{"createdAt": r.s.Now(), "admin": true}
		opts = append(opts, options.UpdateOne().SetUpsert(true))
	}
	res, err := r.coll().UpdateOne(ctx, bson.M{"_id": username}, upd, opts...)
	if err != nil {
		return fmt.Errorf("set password of %s: %w", username, err)
	}
	if res.MatchedCount == 0 && res.UpsertedCount == 0 {
		return fmt.Errorf("user %s: %w", username, ErrNotFound)
	}
	return nil
}

// SetRole sets a user's kloud-wide role (model.RoleOwner, …; "" or RoleUser: member) and keeps
// the admin flag in step with it (an owner is a kloud administrator). With create, a missing
// user is created (the built-in admin has no document until its password or role is set).
func (r *Users) SetRole(ctx context.Context, username, role string, create bool) error {
	set := bson.M{"role": role, "admin": role == model.RoleOwner}
	if role == "" || role == model.RoleUser {
		set["role"] = model.RoleUser
	}
	upd := bson.M{"$set": set}
	var opts []options.Lister[options.UpdateOneOptions]
	if create {
		upd["$setOnInsert"] = bson.M{"createdAt": r.s.Now()}
		opts = append(opts, options.UpdateOne().SetUpsert(true))
	}
	res, err := r.coll().UpdateOne(ctx, bson.M{"_id": username}, upd, opts...)
	if err != nil {
		return fmt.Errorf("set role of %s: %w", username, err)
	}
	if res.MatchedCount == 0 && res.UpsertedCount == 0 {
		return fmt.Errorf("user %s: %w", username, ErrNotFound)
	}
	return nil
}

// SetSSOTeams records the teams single sign-on made a user a member of.
func (r *Users) SetSSOTeams(ctx context.Context, username string, teams []string) error {
	if teams == nil {
		teams = []string{}
	}
	return updateByID(ctx, r.coll(), "user", username, bson.M{"$set": bson.M{"ssoTeams": teams}})
}

// ---- teams

// Teams is the teams collection (_id = slug).
type Teams struct{ s *Store }

// Teams returns the teams repository.
func (s *Store) Teams() *Teams { return &Teams{s} }

func (r *Teams) coll() *mongo.Collection { return r.s.db.Collection(CollTeams) }

// Get returns a team.
func (r *Teams) Get(ctx context.Context, slug string) (model.Team, error) {
	return findOne[model.Team](ctx, r.coll(), "team", slug, bson.M{"_id": slug})
}

// Insert creates a team.
func (r *Teams) Insert(ctx context.Context, t model.Team) error {
	return insert(ctx, r.coll(), "team", t.Slug, t)
}

// List returns every team.
func (r *Teams) List(ctx context.Context) ([]model.Team, error) {
	return findAll[model.Team](ctx, r.coll(), bson.M{})
}

// Named returns the teams among slugs that exist.
func (r *Teams) Named(ctx context.Context, slugs []string) ([]model.Team, error) {
	return findAll[model.Team](ctx, r.coll(), bson.M{"_id": in(slugs)})
}

// OfMember returns the teams username is a member of.
func (r *Teams) OfMember(ctx context.Context, username string) ([]model.Team, error) {
	return findAll[model.Team](ctx, r.coll(), bson.M{"members.username": username})
}

// SetMembers replaces a team's member list if it is still old (as read). It reports whether it
// was.
func (r *Teams) SetMembers(ctx context.Context, slug string, old, members []model.Member) (bool, error) {
	return update(ctx, r.coll(), "team", slug, bson.M{"_id": slug, "members": old}, bson.M{"$set": bson.M{"members": members}})
}

// ---- credentials

// Credentials is the credentials collection.
type Credentials struct{ s *Store }

// Credentials returns the credentials repository.
func (s *Store) Credentials() *Credentials { return &Credentials{s} }

func (r *Credentials) coll() *mongo.Collection { return r.s.db.Collection(CollCredentials) }

// Get returns a credential.
func (r *Credentials) Get(ctx context.Context, id string) (model.Credential, error) {
	return findOne[model.Credential](ctx, r.coll(), "credential", id, bson.M{"_id": id})
}

// Insert adds a credential.
func (r *Credentials) Insert(ctx context.Context, c model.Credential) error {
	return insert(ctx, r.coll(), "credential", c.ID, c)
}

// CredentialFilter selects credentials for [Credentials.List]. Teams is always applied (no
// teams: no credentials) unless AllTeams is set, so a forgotten field never shows every team's
// credentials.
type CredentialFilter struct {
	Teams    []string // in one of these teams
	AllTeams bool     // any team (kloud administrators)
	Provider string   // "": any provider
	Limit    int64    // 0: no limit
}

// List returns the matching credentials, oldest first.
func (r *Credentials) List(ctx context.Context, f CredentialFilter) ([]model.Credential, error) {
	filter := bson.M{}
	if !f.AllTeams {
		filter["team"] = in(f.Teams)
	}
	if f.Provider != "" {
		filter["provider"] = f.Provider
	}
	opts := options.Find().SetSort(bson.D{{Key: "createdAt", Value: 1}})
	if f.Limit > 0 {
		opts.SetLimit(f.Limit)
	}
	return findAll[model.Credential](ctx, r.coll(), filter, opts)
}

// SetVerified records the provider's verdict on a credential.
func (r *Credentials) SetVerified(ctx context.Context, id string, verified bool, verifyErr string) error {
	return updateByID(ctx, r.coll(), "credential", id,
		bson.M{"$set": bson.M{"verified": verified, "verifyError": verifyErr, "updatedAt": r.s.Now()}})
}

// UpdateValue replaces a credential's sealed value, its public fields and its list of set
// secret fields, in one update, if the credential is unchanged since it was read (updatedAt
// still at) and no bootstrap of it is running or being destroyed. The provider's verdict is
// reset (the new value was not verified). It reports whether it did.
func (r *Credentials) UpdateValue(ctx context.Context, id string, at time.Time, sealed []byte, public map[string]any, secret []string) (bool, error) {
	filter := bson.M{"_id": id, "updatedAt": at, "bootstrap.status": bson.M{"$nin": bson.A{model.BootstrapRunning, model.BootstrapDestroying}}}
	ok, err := update(ctx, r.coll(), "credential", id, filter, bson.M{"$set": bson.M{"sealed": sealed, "public": public,
		"secretFields": secret, "verified": false, "verifyError": "", "updatedAt": r.s.Now()}})
	if err != nil {
		return false, fmt.Errorf("update credential %s: %w", id, err)
	}
	return ok, nil
}

// DeleteIdle deletes a credential unless a bootstrap of it is running or being destroyed. It
// reports whether it did.
func (r *Credentials) DeleteIdle(ctx context.Context, id string) (bool, error) {
	res, err := r.coll().DeleteOne(ctx, bson.M{"_id": id, "bootstrap.status": bson.M{"$nin": bson.A{model.BootstrapRunning, model.BootstrapDestroying}}})
	if err != nil {
		return false, fmt.Errorf("remove credential %s: %w", id, err)
	}
	return res.DeletedCount == 1, nil
}

// ClaimBootstrap moves a credential's bootstrap to status (running or destroying) with no job
// yet, if nobody else holds it: its status is not running or destroying (nor done, unless
// destroy). With stale, a bootstrap whose job is gone is taken over exactly as it was read
// (status, job and updatedAt). It reports whether the claim was made.
func (r *Credentials) ClaimBootstrap(ctx context.Context, id, status string, destroy bool, stale *model.Bootstrap) (bool, error) {
	filter := bson.M{"_id": id, "bootstrap.status": bson.M{"$nin": bson.A{model.BootstrapRunning, model.BootstrapDestroying, model.BootstrapDone}}}
	if destroy {
		filter = bson.M{"_id": id, "bootstrap.status": bson.M{"$nin": bson.A{model.BootstrapRunning, model.BootstrapDestroying}}}
	}
	if stale != nil {
		filter = bson.M{"_id": id, "bootstrap.status": stale.Status, "bootstrap.jobId": stale.JobID, "bootstrap.updatedAt": stale.UpdatedAt}
	}
	set := bson.M{"bootstrap.status": status, "bootstrap.jobId": "", "bootstrap.tfJobs": []string{}, "bootstrap.error": "",
		"bootstrap.updatedAt": r.s.Now()}
	ok, err := update(ctx, r.coll(), "credential", id, filter, bson.M{"$set": set})
	if err != nil {
		return false, fmt.Errorf("claim bootstrap: %w", err)
	}
	return ok, nil
}

// SetBootstrapJob records jobID as the job of a claimed bootstrap, if no other job holds it. It
// reports whether jobID holds it now.
func (r *Credentials) SetBootstrapJob(ctx context.Context, id, jobID string) (bool, error) {
	return update(ctx, r.coll(), "credential", id, bson.M{"_id": id, "bootstrap.jobId": in([]string{"", jobID})},
		bson.M{"$set": bson.M{"bootstrap.jobId": jobID}})
}

// BootstrapSet is a change to a credential's bootstrap state; nil fields are left as they are.
type BootstrapSet struct {
	Status     *string
	Error      *string
	Sealed     *[]byte // a pointer to nil clears the outputs
	Outputs    *[]string
	ContentIDs *[]string
	TFJobs     *[]string
}

// UpdateBootstrap changes the bootstrap state (and its updatedAt) if job jobID still holds it
// ("" before a job was recorded). It reports whether it did.
func (r *Credentials) UpdateBootstrap(ctx context.Context, id, jobID string, b BootstrapSet) (bool, error) {
	set := bson.M{"bootstrap.updatedAt": r.s.Now()}
	setIf(set, "bootstrap.status", b.Status)
	setIf(set, "bootstrap.error", b.Error)
	setIf(set, "bootstrap.sealed", b.Sealed)
	setIf(set, "bootstrap.outputs", b.Outputs)
	setIf(set, "bootstrap.contentIds", b.ContentIDs)
	setIf(set, "bootstrap.tfJobs", b.TFJobs)
	return update(ctx, r.coll(), "credential", id, bson.M{"_id": id, "bootstrap.jobId": jobID}, bson.M{"$set": set})
}

// setIf sets set[k] to *v when v is not nil.
func setIf[T any](set bson.M, k string, v *T) {
	if v != nil {
		set[k] = *v
	}
}

// ---- templates

// Templates is the templates collection.
type Templates struct{ s *Store }

// Templates returns the templates repository.
func (s *Store) Templates() *Templates { return &Templates{s} }

func (r *Templates) coll() *mongo.Collection { return r.s.db.Collection(CollTemplates) }

// Get returns a template.
func (r *Templates) Get(ctx context.Context, id string) (model.Template, error) {
	return findOne[model.Template](ctx, r.coll(), "template", id, bson.M{"_id": id})
}

// ByTitle returns the template of team with this title.
func (r *Templates) ByTitle(ctx context.Context, team, title string) (model.Template, error) {
	return findOne[model.Template](ctx, r.coll(), "template", team+"/"+title, bson.M{"title": title, "team": team})
}

// Insert adds a template.
func (r *Templates) Insert(ctx context.Context, t model.Template) error {
	return insert(ctx, r.coll(), "template", t.ID, t)
}

// List returns every template, oldest first.
func (r *Templates) List(ctx context.Context) ([]model.Template, error) {
	return findAll[model.Template](ctx, r.coll(), bson.M{}, byCreation)
}

// OfTeams returns the templates of teams (none: no templates), oldest first.
func (r *Templates) OfTeams(ctx context.Context, teams []string) ([]model.Template, error) {
	return findAll[model.Template](ctx, r.coll(), bson.M{"team": in(teams)}, byCreation)
}

// Trusted returns the templates of team that carry trust records.
func (r *Templates) Trusted(ctx context.Context, team string) ([]model.Template, error) {
	return findAll[model.Template](ctx, r.coll(), bson.M{"team": team, "trust": bson.M{"$exists": true}})
}

// TemplateUpdate is a change to a template; zero fields are left as they are. A non-nil Files
// makes a new revision: Rev, Providers and Revisions are then written too.
type TemplateUpdate struct {
	Title       string
	Description string
	Files       []model.File
	Providers   []string
	Rev         int
	Revisions   []model.TemplateRevision
	MaxMachines int // the template's machine cap; 0 leaves it as it is
}

// Update changes a template if it is still at revision rev (two concurrent updates cannot both
// win). It reports whether it was.
func (r *Templates) Update(ctx context.Context, id string, rev int, u TemplateUpdate) (bool, error) {
	set := bson.M{"updatedAt": r.s.Now()}
	if u.Title != "" {
		set["title"] = u.Title
	}
	if u.Description != "" {
		set["description"] = u.Description
	}
	if u.Files != nil {
		set["files"], set["providers"], set["rev"], set["revisions"] = u.Files, u.Providers, u.Rev, u.Revisions
	}
	if u.MaxMachines > 0 {
		set["maxMachines"] = u.MaxMachines
	}
	return update(ctx, r.coll(), "template", id, bson.M{"_id": id, "rev": rev}, bson.M{"$set": set})
}

// SetTrust replaces a template's trust records (none: the field is removed).
func (r *Templates) SetTrust(ctx context.Context, id string, trust []model.TemplateTrust) error {
	upd := bson.M{"$set": bson.M{"trust": trust}}
	if len(trust) == 0 {
		upd = bson.M{"$unset": bson.M{"trust": ""}}
	}
	return updateByID(ctx, r.coll(), "template", id, upd)
}

// Delete removes a template (a missing one is not an error).
func (r *Templates) Delete(ctx context.Context, id string) error {
	if _, err := r.coll().DeleteOne(ctx, bson.M{"_id": id}); err != nil {
		return fmt.Errorf("delete template %s: %w", id, err)
	}
	return nil
}

// ---- stacks

// Stacks is the stacks collection.
type Stacks struct{ s *Store }

// Stacks returns the stacks repository.
func (s *Store) Stacks() *Stacks { return &Stacks{s} }

func (r *Stacks) coll() *mongo.Collection { return r.s.db.Collection(CollStacks) }

// Get returns a stack.
func (r *Stacks) Get(ctx context.Context, id string) (model.Stack, error) {
	return findOne[model.Stack](ctx, r.coll(), "stack", id, bson.M{"_id": id})
}

// Insert adds a stack.
func (r *Stacks) Insert(ctx context.Context, st model.Stack) error {
	return r.s.told(insert(ctx, r.coll(), "stack", st.ID, st), Change{Coll: CollStacks, ID: st.ID})
}

// StackFilter selects stacks for [Stacks.List]: those matching every non-empty field. An
// empty filter selects nothing unless All is set, so a forgotten field never lists everyone's.
type StackFilter struct {
	Owner string
	Team  string
	All   bool // no condition (kloud administrators)
}

// List returns the matching stacks, oldest first.
func (r *Stacks) List(ctx context.Context, f StackFilter) ([]model.Stack, error) {
	if f == (StackFilter{}) {
		return []model.Stack{}, nil
	}
	filter := bson.M{}
	if f.Owner != "" {
		filter["owner"] = f.Owner
	}
	if f.Team != "" {
		filter["team"] = f.Team
	}
	return findAll[model.Stack](ctx, r.coll(), filter, byCreation)
}

// UsingCredential returns the stacks that name credential id for provider.
func (r *Stacks) UsingCredential(ctx context.Context, provider, id string) ([]model.Stack, error) {
	return findAll[model.Stack](ctx, r.coll(), bson.M{"credentials." + provider: id})
}

// InStates returns the stacks in one of states.
func (r *Stacks) InStates(ctx context.Context, states []string) ([]model.Stack, error) {
	return findAll[model.Stack](ctx, r.coll(), bson.M{StateField: in(states)})
}

// StackSet is a change to a stack; nil fields are left as they are. updatedAt is always set.
type StackSet struct {
	State   *string
	Reason  *string
	JobID   *string
	TFJobID *string
}

func (u StackSet) fields() bson.M {
	set := bson.M{}
	setIf(set, StateField, u.State)
	setIf(set, "reason", u.Reason)
	setIf(set, "jobId", u.JobID)
	setIf(set, "tfJobId", u.TFJobID)
	return set
}

// jobMatch matches a stack's jobId field: a missing or empty field when id is empty.
func jobMatch(id string) any {
	if id == "" {
		return bson.M{"$in": bson.A{nil, ""}}
	}
	return id
}

// Set changes a stack unconditionally.
func (r *Stacks) Set(ctx context.Context, id string, u StackSet) error {
	set := u.fields()
	set["updatedAt"] = r.s.Now()
	return r.s.told(updateByID(ctx, r.coll(), "stack", id, bson.M{"$set": set}), Change{Coll: CollStacks, ID: id})
}

// Transition changes a stack if it is in one of from (see [Store.Transition]).
func (r *Stacks) Transition(ctx context.Context, id string, from []string, u StackSet) (bool, error) {
	return r.s.toldIf(r.s.TransitionIf(ctx, CollStacks, id, from, nil, u.fields()))(Change{Coll: CollStacks, ID: id})
}

// TransitionOfJob is [Stacks.Transition] that also requires the stack to belong to job jobID
// ("": to no job).
func (r *Stacks) TransitionOfJob(ctx context.Context, id string, from []string, jobID string, u StackSet) (bool, error) {
	return r.s.toldIf(r.s.TransitionIf(ctx, CollStacks, id, from, bson.M{"jobId": jobMatch(jobID)}, u.fields()))(Change{Coll: CollStacks, ID: id})
}

// Reset forces a stack from state (still belonging to job jobID) with u and appends audit to
// its resets. It reports whether the stack was still as read.
func (r *Stacks) Reset(ctx context.Context, id, state, jobID string, u StackSet, audit model.StackReset) (bool, error) {
	set := u.fields()
	set["updatedAt"] = r.s.Now()
	return r.s.toldIf(update(ctx, r.coll(), "stack", id, bson.M{"_id": id, StateField: state, "jobId": jobMatch(jobID)},
		bson.M{"$set": set, "$push": bson.M{"resets": audit}}))(Change{Coll: CollStacks, ID: id})
}

// Delete removes a stack (a missing one is not an error).
func (r *Stacks) Delete(ctx context.Context, id string) error {
	c := Change{Coll: CollStacks, ID: id, Deleted: true}
	if r.s.watched() {
		if st, err := r.Get(ctx, id); err == nil {
			c.Gone = st
		}
	}
	if _, err := r.coll().DeleteOne(ctx, bson.M{"_id": id}); err != nil {
		return fmt.Errorf("delete stack %s: %w", id, err)
	}
	r.s.changed(c)
	return nil
}

// ---- machines

// Machines is the machines collection.
type Machines struct{ s *Store }

// Machines returns the machines repository.
func (s *Store) Machines() *Machines { return &Machines{s} }

func (r *Machines) coll() *mongo.Collection { return r.s.db.Collection(CollMachines) }

// Get returns a machine.
func (r *Machines) Get(ctx context.Context, id string) (model.Machine, error) {
	return findOne[model.Machine](ctx, r.coll(), "machine", id, bson.M{"_id": id})
}

// ByKite returns the machine whose agent has kite id kiteID.
func (r *Machines) ByKite(ctx context.Context, kiteID string) (model.Machine, error) {
	return findOne[model.Machine](ctx, r.coll(), "machine of kite", kiteID, bson.M{"kiteId": kiteID})
}

// InsertMany adds machines.
func (r *Machines) InsertMany(ctx context.Context, ms []model.Machine) error {
	docs := make([]any, len(ms))
	for i := range ms {
		docs[i] = ms[i]
	}
	if _, err := r.coll().InsertMany(ctx, docs); err != nil {
		if IsDuplicateKey(err) {
			return fmt.Errorf("insert machines: %w", ErrConflict)
		}
		return fmt.Errorf("insert machines: %w", err)
	}
	for _, m := range ms {
		r.s.changed(Change{Coll: CollMachines, ID: m.ID})
	}
	return nil
}

// ByStack returns the machines of a stack, by label.
func (r *Machines) ByStack(ctx context.Context, stackID string) ([]model.Machine, error) {
	return findAll[model.Machine](ctx, r.coll(), bson.M{"stackId": stackID}, options.Find().SetSort(bson.D{{Key: "label", Value: 1}}))
}

// InStack reports whether machine id exists and belongs to stack stackID.
func (r *Machines) InStack(ctx context.Context, stackID, id string) (bool, error) {
	n, err := r.coll().CountDocuments(ctx, bson.M{"_id": id, "stackId": stackID})
	if err != nil {
		return false, fmt.Errorf("look up machine %s: %w", id, err)
	}
	return n > 0, nil
}

// SharedWith reports whether the machine whose agent is kiteID is shared with username.
func (r *Machines) SharedWith(ctx context.Context, kiteID, username string) (bool, error) {
	n, err := r.coll().CountDocuments(ctx, bson.M{"kiteId": kiteID, "shares.username": username})
	if err != nil {
		return false, fmt.Errorf("look up shares of kite %s: %w", kiteID, err)
	}
	return n > 0, nil
}

// MachineFilter selects machines for [Machines.List]: those matching every non-empty field.
// An empty filter selects nothing unless All is set.
type MachineFilter struct {
	Visible string // owned by or shared with this user
	Team    string
	StackID string
	All     bool // no condition
}

// List returns the matching machines, oldest first.
func (r *Machines) List(ctx context.Context, f MachineFilter) ([]model.Machine, error) {
	if f == (MachineFilter{}) {
		return []model.Machine{}, nil
	}
	var and []bson.M
	if f.Visible != "" {
		and = append(and, bson.M{"$or": []bson.M{{"owner": f.Visible}, {"shares.username": f.Visible}}})
	}
	if f.Team != "" {
		and = append(and, bson.M{"team": f.Team})
	}
	if f.StackID != "" {
		and = append(and, bson.M{"stackId": f.StackID})
	}
	filter := bson.M{}
	if len(and) > 0 {
		filter = bson.M{"$and": and}
	}
	return findAll[model.Machine](ctx, r.coll(), filter, byCreation)
}

// InStates returns the machines in one of states.
func (r *Machines) InStates(ctx context.Context, states []string) ([]model.Machine, error) {
	return findAll[model.Machine](ctx, r.coll(), bson.M{StateField: in(states)})
}

// MachineSet is a change to a machine; nil fields are left as they are. updatedAt is always set.
type MachineSet struct {
	State        *string
	Reason       *string
	KiteID       *string
	Agent        *model.Agent // the whole agent record
	AgentStatus  *string
	AgentSeen    *time.Time
	AgentVersion *string
	IPAddress    *string
	SSHHostKey   *string // the key klient reported (kloud/relay ssh.go)
	Attributes   map[string]any
	Meta         any // what the provider reports (nil: unchanged)
}

func (u MachineSet) fields(now time.Time) bson.M {
	set := bson.M{"updatedAt": now}
	setIf(set, StateField, u.State)
	setIf(set, "reason", u.Reason)
	setIf(set, "kiteId", u.KiteID)
	setIf(set, "agent", u.Agent)
	setIf(set, "agent.status", u.AgentStatus)
	setIf(set, "agent.lastSeen", u.AgentSeen)
	setIf(set, "agent.version", u.AgentVersion)
	setIf(set, "ipAddress", u.IPAddress)
	setIf(set, "sshHostKey", u.SSHHostKey)
	if u.Attributes != nil {
		set["attributes"] = u.Attributes
	}
	if u.Meta != nil {
		set["meta"] = u.Meta
	}
	return set
}

// Set changes a machine unconditionally.
func (r *Machines) Set(ctx context.Context, id string, u MachineSet) error {
	return r.s.told(updateByID(ctx, r.coll(), "machine", id, bson.M{"$set": u.fields(r.s.Now())}), Change{Coll: CollMachines, ID: id})
}

// Transition changes a machine if it is in one of from (see [Store.Transition]).
func (r *Machines) Transition(ctx context.Context, id string, from []string, u MachineSet) (bool, error) {
	return r.s.toldIf(r.s.TransitionIf(ctx, CollMachines, id, from, nil, u.fields(r.s.Now())))(Change{Coll: CollMachines, ID: id})
}

// TransitionUnchanged is [Machines.Transition] that also requires the machine's updatedAt to
// be at (nobody changed it since it was read).
func (r *Machines) TransitionUnchanged(ctx context.Context, id string, from []string, at time.Time, u MachineSet) (bool, error) {
	return r.s.toldIf(r.s.TransitionIf(ctx, CollMachines, id, from, bson.M{"updatedAt": at}, u.fields(r.s.Now())))(Change{Coll: CollMachines, ID: id})
}

// SetShares replaces a machine's share list if nobody changed the machine since at (its
// updatedAt as read). It reports whether it did.
func (r *Machines) SetShares(ctx context.Context, id string, at time.Time, shares []model.Share) (bool, error) {
	c := Change{Coll: CollMachines, ID: id, Field: "shares"}
	if before := r.machinesBefore(ctx, "", id); before != nil {
		c.Gone = before // who saw it before: a user whose share went is told too
	}
	return r.s.toldIf(update(ctx, r.coll(), "machine", id, bson.M{"_id": id, "updatedAt": at},
		bson.M{"$set": bson.M{"shares": shares, "updatedAt": r.s.Now()}}))(c)
}

// SetAgent records the status (and, if not empty, version) of the agent with kite id kiteID,
// seen now. A kite that is no machine's agent changes nothing.
func (r *Machines) SetAgent(ctx context.Context, kiteID, status, version string) error {
	set := bson.M{"agent.status": status, "agent.lastSeen": r.s.Now()}
	if version != "" {
		set["agent.version"] = version
	}
	res, err := r.coll().UpdateOne(ctx, bson.M{"kiteId": kiteID}, bson.M{"$set": set})
	if err != nil {
		return fmt.Errorf("update agent of kite %s: %w", kiteID, err)
	}
	if res.MatchedCount > 0 {
		r.s.changed(Change{Coll: CollMachines, KiteID: kiteID, Field: "agent"})
	}
	return nil
}

// SetAgentOf is [Machines.SetAgent] by the kloud replica holding (or having held) the agent's
// connection: connected records replica as the agent's; disconnected is written only while the
// record names replica (or no replica), so a replica that notices late that an agent left it
// does not mark disconnected an agent that reconnected to another replica meanwhile. It
// reports whether it wrote.
func (r *Machines) SetAgentOf(ctx context.Context, kiteID, status, version, replica string) (bool, error) {
	set := bson.M{"agent.status": status, "agent.lastSeen": r.s.Now()}
	if version != "" {
		set["agent.version"] = version
	}
	filter := bson.M{"kiteId": kiteID}
	if status == model.AgentConnected {
		set["agent.replica"] = replica
	} else {
		filter["$or"] = bson.A{bson.M{"agent.replica": replica}, bson.M{"agent.replica": bson.M{"$exists": false}}}
	}
	res, err := r.coll().UpdateOne(ctx, filter, bson.M{"$set": set})
	if err != nil {
		return false, fmt.Errorf("update agent of kite %s: %w", kiteID, err)
	}
	if res.MatchedCount > 0 {
		r.s.changed(Change{Coll: CollMachines, KiteID: kiteID, Field: "agent"})
	}
	return res.MatchedCount > 0, nil
}

// SetKiteIDs records the agent kite id of each machine (machine id → kite id) with agent as its
// agent record, in one write (a stack build does it before Terraform runs). A machine that does
// not exist is ErrNotFound; the others are written.
func (r *Machines) SetKiteIDs(ctx context.Context, ids map[string]string, agent model.Agent) error {
	if len(ids) == 0 {
		return nil
	}
	now := r.s.Now()
	models := make([]mongo.WriteModel, 0, len(ids))
	for id, kiteID := range ids {
		models = append(models, mongo.NewUpdateOneModel().SetFilter(bson.M{"_id": id}).
			SetUpdate(bson.M{"$set": bson.M{"kiteId": kiteID, "agent": agent, "updatedAt": now}}))
	}
	res, err := r.coll().BulkWrite(ctx, models, options.BulkWrite().SetOrdered(false))
	if err != nil {
		return fmt.Errorf("record kite ids of %d machines: %w", len(ids), err)
	}
	if res.MatchedCount != int64(len(ids)) {
		return fmt.Errorf("record kite ids: %d of %d machines: %w", len(ids)-int(res.MatchedCount), len(ids), ErrNotFound)
	}
	for id := range ids {
		r.s.changed(Change{Coll: CollMachines, ID: id, Field: "agent"})
	}
	return nil
}

// DeleteByStack removes the machines of a stack.
func (r *Machines) DeleteByStack(ctx context.Context, stackID string) error {
	gone := r.machinesBefore(ctx, stackID)
	if _, err := r.coll().DeleteMany(ctx, bson.M{"stackId": stackID}); err != nil {
		return fmt.Errorf("delete machines of stack %s: %w", stackID, err)
	}
	r.s.changed(Change{Coll: CollMachines, StackID: stackID, Deleted: true, Gone: gone})
	return nil
}
