package kloud

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/klient/klientapi"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/stackbuild"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/provider/tmpl"
)

// Bucket claims (docs/buckets.md "Claims"): a template's kloud_bucket blocks are kloud's, not
// Terraform's. The template build (stacks.go build) reads and checks them, resolves each one's
// provider and takes them out of the files Terraform sees; the build flow provisions them
// (stackbuild/buckets.go) before the machines and the destroy ends them after.

// templateBuckets reads cfg's kloud_bucket blocks, resolves the provider of each (its
// provider argument, else the one provider of the template's machines, machineProviders,
// that provisions buckets) and removes them from cfg. Problems are invalid params naming the
// file and line.
func templateBuckets(reg *provider.Registry, cfg *tmpl.Config, machineProviders []string) ([]stackbuild.BucketSpec, error) {
	decls, err := cfg.Buckets()
	if err != nil {
		return nil, fmt.Errorf("template: %s: %w", err.Error(), kite.ErrInvalidParams)
	}
	if len(decls) == 0 {
		return nil, nil
	}
	var capable []string
	for _, name := range machineProviders {
		if p, err := reg.Lookup(name); err == nil && p.Buckets != nil {
			capable = append(capable, name)
		}
	}
	slices.Sort(capable)
	var out []stackbuild.BucketSpec
	for _, d := range decls {
		s := stackbuild.BucketSpec{Label: d.Label, Provider: d.Provider, Retain: d.Retain, MaxBytes: d.MaxSizeMB << 20}
		where := fmt.Sprintf("template: %s:%d: resource %q %q", d.File, d.Line, tmpl.BucketType, d.Label)
		switch {
		case s.Provider != "":
			p, err := reg.Lookup(s.Provider)
			if err != nil || p.Buckets == nil {
				return nil, fmt.Errorf("%s: provider %q provisions no buckets (%s): %w", where, s.Provider, bucketProviders(reg), kite.ErrInvalidParams)
			}
		case len(capable) == 1:
			s.Provider = capable[0]
		default:
			why := "none of the stack's machine providers provisions buckets"
			if len(capable) > 1 {
				why = "several of the stack's machine providers provision buckets (" + strings.Join(capable, ", ") + ")"
			}
			return nil, fmt.Errorf("%s: %s: say which with provider = \"NAME\" (%s): %w", where, why, bucketProviders(reg), kite.ErrInvalidParams)
		}
		out = append(out, s)
	}
	if err := cfg.RemoveBuckets(); err != nil {
		return nil, fmt.Errorf("template: %w", err)
	}
	return out, nil
}

// bucketProviders says which providers provision buckets.
func bucketProviders(reg *provider.Registry) string {
	var out []string
	for _, name := range reg.Names() {
		if p, _ := reg.Lookup(name); p.Buckets != nil {
			out = append(out, name)
		}
	}
	if len(out) == 0 {
		return "no provider of this kloud provisions buckets"
	}
	return "providers that do: " + strings.Join(out, ", ")
}

// bucketAPI serves bucket.* (docs/protocol.md): the claims of stacks the caller can see,
// their keys for the users they belong to, grants and revokes, and ending a claim now.
type bucketAPI struct {
	claims    *store.BucketClaims
	stacks    *store.Stacks
	caller    func(ctx context.Context, username string, admin bool) (*Caller, error) // callerByName
	loadStack func(ctx context.Context, c *Caller, id string) (*model.Stack, error)   // owner, team admins
	flow      func() *stackbuild.Flow                                                 // the provisioners, DeleteBucket
	machines  *store.Machines
	agentConn func(ctx context.Context, m *model.Machine) (agentCaller, error) // mesh.go
	log       *slog.Logger
}

func bucketView(c model.BucketClaim) api.BucketView {
	return api.BucketView{StackID: c.StackID, Label: c.Label, Bucket: c.Bucket, Provider: c.Provider, Owner: c.Owner, Team: c.Team,
		Endpoint: c.Endpoint, Region: c.Region, Retain: c.Retain, MaxBytes: c.MaxBytes, State: c.State, Grants: c.Grants,
		ShareGrants: c.ShareGrants}
}

// list serves bucket.list: the claims of one stack the caller owns or administers, or of
// every such stack (owners and auditors: every stack), and those the caller has a grant on.
// Never a key.
func (a *bucketAPI) list(ctx context.Context, c *Caller, _ *kite.Request, p *api.BucketListParams) (api.BucketListResult, error) {
	var ids []string
	if p.StackID != "" {
		if _, err := a.loadStack(ctx, c, p.StackID); err != nil {
			return api.BucketListResult{}, err
		}
		ids = []string{p.StackID}
	} else {
		f := store.StackFilter{Owner: c.Username}
		if c.Admin { // owners (and auditors, reading): every stack's
			f = store.StackFilter{All: true}
		}
		sts, err := a.stacks.List(ctx, f)
		if err != nil {
			return api.BucketListResult{}, err
		}
		for _, team := range c.TeamNames() {
			if c.TeamAdmin(team) && !c.Admin {
				more, err := a.stacks.List(ctx, store.StackFilter{Team: team})
				if err != nil {
					return api.BucketListResult{}, err
				}
				sts = append(sts, more...)
			}
		}
		for _, st := range sts {
			if !slices.Contains(ids, st.ID) {
				ids = append(ids, st.ID)
			}
		}
	}
	cs, err := a.claims.ByStacks(ctx, ids)
	if err != nil {
		return api.BucketListResult{}, err
	}
	if p.StackID == "" {
		granted, err := a.claims.Granted(ctx, c.Username)
		if err != nil {
			return api.BucketListResult{}, err
		}
		for _, g := range granted {
			if !slices.ContainsFunc(cs, func(x model.BucketClaim) bool { return x.ID == g.ID }) {
				cs = append(cs, g)
			}
		}
	}
	out := api.BucketListResult{Buckets: []api.BucketView{}}
	for _, cl := range cs {
		out.Buckets = append(out.Buckets, bucketView(cl))
	}
	return out, nil
}

// claim loads the ready claim p names on a stack the caller owns or administers.
func (a *bucketAPI) claim(ctx context.Context, c *Caller, p api.BucketRef) (*model.Stack, model.BucketClaim, error) {
	st, err := a.loadStack(ctx, c, p.StackID)
	if err != nil {
		return nil, model.BucketClaim{}, err
	}
	cl, err := a.claims.Get(ctx, model.BucketClaimID(st.ID, p.Label))
	if err != nil {
		return nil, model.BucketClaim{}, err
	}
	if cl.State != model.BucketReady {
		return nil, model.BucketClaim{}, fmt.Errorf("bucket %s of stack %s is %s: %w", cl.Label, st.ID, cl.State, kite.ErrState)
	}
	return st, cl, nil
}

// credentials serves bucket.credentials: the caller's own key to the bucket, the owner's
// (Provision again: the same key) or a granted user's (Grant again with the recorded access:
// the same key). The one answer with a key.
func (a *bucketAPI) credentials(ctx context.Context, c *Caller, _ *kite.Request, p *api.BucketRef) (api.BucketCredentials, error) {
	cl, err := a.claims.Get(ctx, model.BucketClaimID(p.StackID, p.Label))
	if errors.Is(err, store.ErrNotFound) || err == nil && cl.Owner != c.Username && cl.Access(c.Username) == "" {
		return api.BucketCredentials{}, notFound("bucket", p.StackID+"/"+p.Label)
	}
	if err != nil {
		return api.BucketCredentials{}, err
	}
	if cl.State != model.BucketReady {
		return api.BucketCredentials{}, fmt.Errorf("bucket %s is %s: %w", cl.Label, cl.State, kite.ErrState)
	}
	bp, err := a.flow().Provisioner(cl.Provider)
	if err != nil {
		return api.BucketCredentials{}, fmt.Errorf("bucket %s: %s: %w", cl.Label, err.Error(), kite.ErrState)
	}
	b := provider.Bucket{Name: cl.Bucket, Endpoint: cl.Endpoint, Region: cl.Region}
	var key provider.BucketKey
	if cl.Owner == c.Username {
		b, key, err = bp.Provision(ctx, provider.BucketClaim{Name: cl.Bucket, Owner: cl.Owner, MaxBytes: cl.MaxBytes,
			Tags: provider.ResourceTags(cl.StackID, cl.Team, cl.Owner, "", "")})
	} else {
		key, err = bp.Grant(ctx, cl.Bucket, c.Username, provider.BucketAccess(cl.Access(c.Username)))
	}
	if err != nil {
		return api.BucketCredentials{}, fmt.Errorf("bucket %s: %w", cl.Label, err)
	}
	return api.BucketCredentials{StackID: cl.StackID, Label: cl.Label, Bucket: b.Name, Endpoint: b.Endpoint, Region: b.Region,
		Access: string(key.Access), AccessKeyID: key.AccessKey, SecretAccessKey: key.SecretKey}, nil
}

// grant serves bucket.grant (stack owner, team admins): the user gets a key with access to
// the bucket (the higher of this grant and what a share of one of the stack's machines gives) (the server's change first, then the record: a crash between leaves a key a
// revoke or the next grant settles).
func (a *bucketAPI) grant(ctx context.Context, c *Caller, _ *kite.Request, p *api.BucketGrantParams) (api.BucketView, error) {
	st, cl, err := a.claim(ctx, c, p.BucketRef)
	if err != nil {
		return api.BucketView{}, err
	}
	if p.User == cl.Owner {
		return api.BucketView{}, fmt.Errorf("%s owns the bucket (write access already): %w", p.User, kite.ErrInvalidParams)
	}
	u, err := a.caller(ctx, p.User, false)
	if err != nil {
		return api.BucketView{}, err
	}
	if !u.InTeam(st.Team) {
		return api.BucketView{}, fmt.Errorf("user %s is not in team %s: %w", p.User, st.Team, kite.ErrInvalidParams)
	}
	bp, err := a.flow().Provisioner(cl.Provider)
	if err != nil {
		return api.BucketView{}, fmt.Errorf("bucket %s: %s: %w", cl.Label, err.Error(), kite.ErrState)
	}
	cl.Grants = maps.Clone(cl.Grants)
	if cl.Grants == nil {
		cl.Grants = map[string]string{}
	}
	cl.Grants[p.User] = p.Access
	if err := setAccess(ctx, bp, cl, p.User); err != nil {
		return api.BucketView{}, err
	}
	if err := a.claims.SetGrant(ctx, cl.ID, p.User, p.Access); err != nil {
		return api.BucketView{}, err
	}
	return a.view(ctx, cl.ID)
}

// revoke serves bucket.revoke (stack owner, team admins): the user's key stops working (or,
// while a share of one of the stack's machines gives them access, keeps only that access).
// Revoking a user without a grant succeeds.
func (a *bucketAPI) revoke(ctx context.Context, c *Caller, _ *kite.Request, p *api.BucketRevokeParams) (api.BucketView, error) {
	_, cl, err := a.claim(ctx, c, p.BucketRef)
	if err != nil {
		return api.BucketView{}, err
	}
	if p.User == cl.Owner {
		return api.BucketView{}, fmt.Errorf("%s owns the bucket: delete it instead (bucket.delete): %w", p.User, kite.ErrInvalidParams)
	}
	bp, err := a.flow().Provisioner(cl.Provider)
	if err != nil {
		return api.BucketView{}, fmt.Errorf("bucket %s: %s: %w", cl.Label, err.Error(), kite.ErrState)
	}
	cl.Grants = maps.Clone(cl.Grants)
	delete(cl.Grants, p.User)
	if err := setAccess(ctx, bp, cl, p.User); err != nil { // a machine's share may still give some
		return api.BucketView{}, err
	}
	if err := a.claims.RemoveGrant(ctx, cl.ID, p.User); err != nil {
		return api.BucketView{}, err
	}
	return a.view(ctx, cl.ID)
}

// delete serves bucket.delete (stack owner, team admins): the claim ends now, the data deleted
// or kept (p.Retain, else the claim's own). It answers the claim as it was.
func (a *bucketAPI) delete(ctx context.Context, c *Caller, _ *kite.Request, p *api.BucketDeleteParams) (api.BucketView, error) {
	st, err := a.loadStack(ctx, c, p.StackID)
	if err != nil {
		return api.BucketView{}, err
	}
	// Not while a job builds or destroys the stack (it provisions or deletes its claims).
	owner, release, err := a.flow().TakeLease(ctx, "stack/"+st.ID, "bucket-delete", "stack "+st.ID+" is busy (a job holds it); delete the bucket when it is done")
	if err != nil {
		return api.BucketView{}, err
	}
	defer release()
	defer a.flow().KeepLease(ctx, "stack/"+st.ID, owner)()
	cl, err := a.claims.Get(ctx, model.BucketClaimID(st.ID, p.Label))
	if err != nil {
		return api.BucketView{}, err
	}
	if p.Retain != nil {
		cl.Retain = *p.Retain
	}
	if err := a.flow().DeleteBucket(ctx, cl); err != nil {
		return api.BucketView{}, err
	}
	v := bucketView(cl)
	v.State = "deleted"
	return v, nil
}

func (a *bucketAPI) view(ctx context.Context, id string) (api.BucketView, error) {
	cl, err := a.claims.Get(ctx, id)
	if err != nil {
		return api.BucketView{}, err
	}
	return bucketView(cl), nil
}

// deliver gives the machines of st whose agents are connected the stack's ready buckets
// (klient.setBuckets: endpoint, region and the owner's key, asked of the provisioner again),
// logging on j (nil: kloud's log) what it could not. An agent without the feature is skipped.
func (a *bucketAPI) deliver(ctx context.Context, j stackbuild.Job, st *model.Stack) {
	a.deliverTo(ctx, j, st.ID, "")
}

// deliverTo is deliver to the machines of stack stackID, or only to machine only.
func (a *bucketAPI) deliverTo(ctx context.Context, j stackbuild.Job, stackID, only string) {
	st := &model.Stack{ID: stackID}
	logf := func(format string, args ...any) {
		if j != nil {
			j.Logf(ctx, format, args...)
		} else {
			a.log.WarnContext(ctx, fmt.Sprintf(format, args...), "stack", st.ID)
		}
	}
	if err := a.syncShares(ctx, st.ID); err != nil {
		logf("bucket access of the machines' shared users not updated: %v", err)
	}
	cs, err := a.claims.ByStack(ctx, st.ID)
	if err != nil {
		logf("buckets not delivered to the machines: %v", err)
		return
	}
	p := klientapi.SetBucketsParams{Buckets: []klientapi.BucketEnv{}}
	for _, c := range cs {
		if c.State != model.BucketReady {
			continue
		}
		bp, err := a.flow().Provisioner(c.Provider)
		if err != nil {
			logf("bucket %s not delivered: %v", c.Label, err)
			continue
		}
		b, key, err := bp.Provision(ctx, provider.BucketClaim{Name: c.Bucket, Owner: c.Owner, MaxBytes: c.MaxBytes,
			Tags: provider.ResourceTags(c.StackID, c.Team, c.Owner, "", "")})
		if err != nil {
			logf("bucket %s not delivered: %v", c.Label, err)
			continue
		}
		p.Buckets = append(p.Buckets, klientapi.BucketEnv{Label: c.Label, Bucket: b.Name, Endpoint: b.Endpoint, Region: b.Region,
			AccessKeyID: key.AccessKey, SecretAccessKey: key.SecretKey})
	}
	if len(cs) == 0 {
		return // a stack that never had buckets: its agents are not asked
	}
	ms, err := a.machines.ByStack(ctx, st.ID)
	if err != nil {
		logf("buckets not delivered to the machines: %v", err)
		return
	}
	for i := range ms {
		m := &ms[i]
		// A job delivers to running machines; an agent that registers gets them whatever its
		// machine's state says (a start registers it before the machine is Running).
		if only == "" && m.State != provider.Running || only != "" && m.ID != only {
			continue
		}
		conn, err := a.agentConn(ctx, m)
		if err != nil {
			logf("%s: buckets not delivered (its agent gets them when it connects): %v", m.Label, err)
			continue
		}
		if !agentHas(ctx, conn, klientapi.FeatureBuckets) {
			logf("%s: its agent predates buckets: rebuild the machine to get them", m.Label)
			continue
		}
		if err := conn.Call(ctx, klientapi.MethodSetBuckets, &p, nil); err != nil {
			logf("%s: buckets not delivered: %v", m.Label, err)
			continue
		}
		if j != nil {
			j.Logf(ctx, "%s: %d bucket(s) delivered", m.Label, len(p.Buckets))
		}
	}
}

// pushOnRegister delivers the buckets of the stack of agent kiteID's machine when the agent
// registers (again), so a machine restarted or reconnected has them.
func (a *bucketAPI) pushOnRegister(ctx context.Context, kiteID string) {
	m, err := a.machines.ByKite(ctx, kiteID)
	if err != nil {
		return // not a machine's agent, or the store is away: the next registration tries again
	}
	a.deliverTo(ctx, nil, m.StackID, m.ID)
}

// setAccess makes user's key to cl's bucket what cl says (cl.Access: the higher of bucket.grant
// and the machines' shares): a key with that access, or none.
func setAccess(ctx context.Context, bp provider.BucketProvisioner, cl model.BucketClaim, user string) error {
	if acc := cl.Access(user); acc != "" {
		if _, err := bp.Grant(ctx, cl.Bucket, user, provider.BucketAccess(acc)); err != nil {
			return fmt.Errorf("bucket %s: grant %s: %w", cl.Label, user, err)
		}
		return nil
	}
	if err := bp.Revoke(ctx, cl.Bucket, user); err != nil {
		return fmt.Errorf("bucket %s: revoke %s: %w", cl.Label, user, err)
	}
	return nil
}

// shareAccess is the bucket access a machine share gives: readonly → read, terminal and full →
// write ("" for anything else).
func shareAccess(grant string) string {
	switch grant {
	case model.GrantReadonly:
		return "read"
	case model.GrantTerminal, model.GrantFull:
		return "write"
	}
	return ""
}

// syncShares makes the grants from machine shares of stack stackID's ready claims what the
// shares of its machines give now (shares.go calls it after a change of shares; deliver after a
// build): every user shared on one of its machines gets the highest access their shares give,
// a user no longer shared loses it (unless bucket.grant gave some). The server's keys change
// first, then the claim (one update): a crash between is repaired by the next sync.
func (a *bucketAPI) syncShares(ctx context.Context, stackID string) error {
	cs, err := a.claims.ByStack(ctx, stackID)
	if err != nil || len(cs) == 0 {
		return err
	}
	ms, err := a.machines.ByStack(ctx, stackID)
	if err != nil {
		return err
	}
	want := map[string]string{}
	for _, m := range ms {
		for _, sh := range m.Shares {
			if acc := shareAccess(sh.Grant); acc != "" && sh.Username != m.Owner && want[sh.Username] != "write" {
				want[sh.Username] = acc
			}
		}
	}
	var errs []error
	for _, cl := range cs {
		if cl.State != model.BucketReady || maps.Equal(cl.ShareGrants, want) {
			continue
		}
		bp, err := a.flow().Provisioner(cl.Provider)
		if err != nil {
			errs = append(errs, fmt.Errorf("bucket %s: %w", cl.Label, err))
			continue
		}
		users := slices.Sorted(maps.Keys(want))
		for u := range cl.ShareGrants {
			if _, ok := want[u]; !ok {
				users = append(users, u)
			}
		}
		before := cl
		cl.ShareGrants = want
		var failed bool
		for _, u := range users {
			if before.Access(u) == cl.Access(u) {
				continue
			}
			if err := setAccess(ctx, bp, cl, u); err != nil {
				errs = append(errs, err)
				failed = true
			}
		}
		if failed {
			continue // recorded as it was: the next sync tries again
		}
		if err := a.claims.SetShareGrants(ctx, cl.ID, want); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// syncBucketShares is the bucket API's syncShares (shareKloud, shares.go).
func (s *Server) syncBucketShares(ctx context.Context, stackID string) error {
	return s.buckets.syncShares(ctx, stackID)
}
