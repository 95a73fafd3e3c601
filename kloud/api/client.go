package api

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/model"
)

// Caller makes one kite call: a *kite.Conn or a *kite.Client.
type Caller interface {
	Call(ctx context.Context, method string, params, result any) error
}

// Client calls kloud's methods with their types. It wraps a kite connection authenticated as
// the user it acts for; errors are the kite errors of the call (match them with errors.Is
// against kite.ErrNotFound, kite.ErrPermission, …).
type Client struct {
	c Caller
}

// NewClient returns a client making its calls on c.
func NewClient(c Caller) *Client { return &Client{c: c} }

// Conn returns the connection the client calls on (for methods outside this package, such as
// kontrol's).
func (c *Client) Conn() Caller { return c.c }

// Version returns the server's version (kloud.version).
func (c *Client) Version(ctx context.Context) (VersionResult, error) {
	return RPCVersion.Call(ctx, c.c, NoParams{})
}

// UserAdd adds a user (kloud administrators).
func (c *Client) UserAdd(ctx context.Context, p UserAddParams) (UserView, error) {
	return RPCUserAdd.Call(ctx, c.c, p)
}

// UserList lists the users the caller may see.
func (c *Client) UserList(ctx context.Context) (UserListResult, error) {
	return RPCUserList.Call(ctx, c.c, NoParams{})
}

// UserWhoami says who the caller is.
func (c *Client) UserWhoami(ctx context.Context) (WhoamiResult, error) {
	return RPCUserWhoami.Call(ctx, c.c, NoParams{})
}

// UserSetRole sets a user's kloud-wide role (owners).
func (c *Client) UserSetRole(ctx context.Context, p SetRoleParams) (UserView, error) {
	return RPCUserSetRole.Call(ctx, c.c, p)
}

// UserSetPassword sets a password (the caller's own; administrators anyone's).
func (c *Client) UserSetPassword(ctx context.Context, p SetPasswordParams) (SetPasswordResult, error) {
	return RPCUserSetPassword.Call(ctx, c.c, p)
}

// TeamCreate creates a team with the caller as its admin.
func (c *Client) TeamCreate(ctx context.Context, p TeamCreateParams) (model.Team, error) {
	return RPCTeamCreate.Call(ctx, c.c, p)
}

// TeamList lists the caller's teams.
func (c *Client) TeamList(ctx context.Context) (TeamListResult, error) {
	return RPCTeamList.Call(ctx, c.c, NoParams{})
}

// TeamAddMember adds a member to a team or changes their role.
func (c *Client) TeamAddMember(ctx context.Context, p TeamMemberParams) (model.Team, error) {
	return RPCTeamAddMember.Call(ctx, c.c, p)
}

// TeamRemoveMember removes a member from a team.
func (c *Client) TeamRemoveMember(ctx context.Context, p TeamMemberParams) (model.Team, error) {
	return RPCTeamRemoveMember.Call(ctx, c.c, p)
}

// ProviderDescribe describes the providers kloud offers.
func (c *Client) ProviderDescribe(ctx context.Context, p ProviderDescribeParams) (ProviderDescribeResult, error) {
	return RPCProviderDescribe.Call(ctx, c.c, p)
}

// ProviderList lists every provider: in-tree and plugins, with their status.
func (c *Client) ProviderList(ctx context.Context) (ProviderListResult, error) {
	return RPCProviderList.Call(ctx, c.c, NoParams{})
}

// ProviderKeyCreate mints a remote plugin's key (kloud administrators).
func (c *Client) ProviderKeyCreate(ctx context.Context, p ProviderKeyCreateParams) (ProviderKeyCreateResult, error) {
	return RPCProviderKeyCreate.Call(ctx, c.c, p)
}

// CredentialAdd adds a credential.
func (c *Client) CredentialAdd(ctx context.Context, p CredentialAddParams) (CredentialAddResult, error) {
	return RPCCredentialAdd.Call(ctx, c.c, p)
}

// CredentialList lists the credentials of the caller's teams.
func (c *Client) CredentialList(ctx context.Context, p CredentialListParams) (CredentialListResult, error) {
	return RPCCredentialList.Call(ctx, c.c, p)
}

// CredentialDescribe describes a credential (no secret values).
func (c *Client) CredentialDescribe(ctx context.Context, p CredentialRef) (CredentialView, error) {
	return RPCCredentialDescribe.Call(ctx, c.c, p)
}

// CredentialUpdate changes fields of a credential's value (see CredentialUpdateParams).
func (c *Client) CredentialUpdate(ctx context.Context, p CredentialUpdateParams) (CredentialUpdateResult, error) {
	return RPCCredentialUpdate.Call(ctx, c.c, p)
}

// CredentialRemove removes a credential.
func (c *Client) CredentialRemove(ctx context.Context, p CredentialRef) (CredentialRemoveResult, error) {
	return RPCCredentialRemove.Call(ctx, c.c, p)
}

// CredentialAuthenticate asks the provider whether a credential works.
func (c *Client) CredentialAuthenticate(ctx context.Context, p CredentialRef) (AuthenticateResult, error) {
	return RPCCredentialAuthenticate.Call(ctx, c.c, p)
}

// CredentialBootstrap starts (or with Destroy, undoes) a credential's bootstrap job.
func (c *Client) CredentialBootstrap(ctx context.Context, p CredentialBootstrapParams) (BootstrapResult, error) {
	return RPCCredentialBootstrap.Call(ctx, c.c, p)
}

// TemplateCreate creates a template.
func (c *Client) TemplateCreate(ctx context.Context, p TemplateParams) (model.Template, error) {
	return RPCTemplateCreate.Call(ctx, c.c, p)
}

// TemplateUpdate updates a template (new files make a new revision).
func (c *Client) TemplateUpdate(ctx context.Context, p TemplateParams) (model.Template, error) {
	return RPCTemplateUpdate.Call(ctx, c.c, p)
}

// TemplateGet returns a template at a revision, with its trust records.
func (c *Client) TemplateGet(ctx context.Context, p TemplateGetParams) (TemplateView, error) {
	return RPCTemplateGet.Call(ctx, c.c, p)
}

// TemplateParameters returns the typed parameters and presets of a template revision.
func (c *Client) TemplateParameters(ctx context.Context, p TemplateGetParams) (TemplateParametersResult, error) {
	return RPCTemplateParameters.Call(ctx, c.c, p)
}

// TemplateList lists templates without their files.
func (c *Client) TemplateList(ctx context.Context, p TemplateListParams) (TemplateListResult, error) {
	return RPCTemplateList.Call(ctx, c.c, p)
}

// TemplateDelete deletes a template.
func (c *Client) TemplateDelete(ctx context.Context, p TemplateRef) (DeleteResult, error) {
	return RPCTemplateDelete.Call(ctx, c.c, p)
}

// TemplateTrust lifts policy rules for a template revision (kloud administrators).
func (c *Client) TemplateTrust(ctx context.Context, p TrustParams) (model.TemplateTrust, error) {
	return RPCTemplateTrust.Call(ctx, c.c, p)
}

// TemplateUntrust removes trust records of a template (kloud administrators).
func (c *Client) TemplateUntrust(ctx context.Context, p TrustParams) (UntrustResult, error) {
	return RPCTemplateUntrust.Call(ctx, c.c, p)
}

// StackPlan plans a template without changing anything.
func (c *Client) StackPlan(ctx context.Context, p StackPlanParams) (StackPlanResult, error) {
	return RPCStackPlan.Call(ctx, c.c, p)
}

// StackPlanJob starts stack.plan as a job; its result (job.watch, job.get) is a
// StackPlanResult (PlanJobResult decodes it).
func (c *Client) StackPlanJob(ctx context.Context, p StackPlanParams) (JobRef, error) {
	return RPCStackPlanJob.Call(ctx, c.c, p)
}

// StackCreate creates a stack (and its machines, NotInitialized) from a template.
func (c *Client) StackCreate(ctx context.Context, p StackPlanParams) (StackCreateResult, error) {
	return RPCStackCreate.Call(ctx, c.c, p)
}

// StackApply builds (or with Destroy, destroys) a stack; it returns the job at once.
func (c *Client) StackApply(ctx context.Context, p StackApplyParams) (JobRef, error) {
	return RPCStackApply.Call(ctx, c.c, p)
}

// StackUpdate updates a stack to a template revision (stackupdate.go); it returns the job.
func (c *Client) StackUpdate(ctx context.Context, p StackUpdateParams) (JobRef, error) {
	return RPCStackUpdate.Call(ctx, c.c, p)
}

// StackScale changes the count of a stack's machine resource and updates it; it returns the job.
func (c *Client) StackScale(ctx context.Context, p StackScaleParams) (JobRef, error) {
	return RPCStackScale.Call(ctx, c.c, p)
}

// StackDescribe returns a stack with its machines.
func (c *Client) StackDescribe(ctx context.Context, p StackRef) (StackView, error) {
	return RPCStackDescribe.Call(ctx, c.c, p)
}

// StackList lists stacks.
func (c *Client) StackList(ctx context.Context, p StackListParams) (StackListResult, error) {
	return RPCStackList.Call(ctx, c.c, p)
}

// StackReset forces a stack out of a stuck state (kloud administrators).
func (c *Client) StackReset(ctx context.Context, p StackResetParams) (StackView, error) {
	return RPCStackReset.Call(ctx, c.c, p)
}

// MachineList lists machines.
func (c *Client) MachineList(ctx context.Context, p MachineListParams) (MachineListResult, error) {
	return RPCMachineList.Call(ctx, c.c, p)
}

// MachineInfo returns a machine reconciled with its provider.
func (c *Client) MachineInfo(ctx context.Context, p MachineRef) (MachineInfo, error) {
	return RPCMachineInfo.Call(ctx, c.c, p)
}

// MachineUpgradeAgent replaces the machine's klient with the one kloud serves (sessions kept).
func (c *Client) MachineUpgradeAgent(ctx context.Context, p MachineRef) (UpgradeAgentResult, error) {
	return RPCMachineUpgradeAgent.Call(ctx, c.c, p)
}

// MachineStart starts a stopped machine; it returns the job at once.
func (c *Client) MachineStart(ctx context.Context, p MachineRef) (JobRef, error) {
	return RPCMachineStart.Call(ctx, c.c, p)
}

// MachineStop stops a running machine; it returns the job at once.
func (c *Client) MachineStop(ctx context.Context, p MachineRef) (JobRef, error) {
	return RPCMachineStop.Call(ctx, c.c, p)
}

// MachineShare shares a machine with a user.
func (c *Client) MachineShare(ctx context.Context, p ShareParams) (SharesResult, error) {
	return RPCMachineShare.Call(ctx, c.c, p)
}

// MachineUnshare takes a share back.
func (c *Client) MachineUnshare(ctx context.Context, p ShareParams) (SharesResult, error) {
	return RPCMachineUnshare.Call(ctx, c.c, p)
}

// MachinePortsOpen opens ports of a machine's firewall.
func (c *Client) MachinePortsOpen(ctx context.Context, p PortsParams) (PortsResult, error) {
	return RPCMachinePortsOpen.Call(ctx, c.c, p)
}

// MachinePortsClose closes ports of a machine's firewall.
func (c *Client) MachinePortsClose(ctx context.Context, p PortsParams) (PortsResult, error) {
	return RPCMachinePortsClose.Call(ctx, c.c, p)
}

// MachinePortsList lists a machine's firewall rules.
func (c *Client) MachinePortsList(ctx context.Context, p MachineRef) (PortsResult, error) {
	return RPCMachinePortsList.Call(ctx, c.c, p)
}

// MachineShares lists a machine's shares.
func (c *Client) MachineShares(ctx context.Context, p MachineRef) (SharesResult, error) {
	return RPCMachineShares.Call(ctx, c.c, p)
}

// JobGet returns a job.
func (c *Client) JobGet(ctx context.Context, p JobRef) (Job, error) {
	return RPCJobGet.Call(ctx, c.c, p)
}

// JobList lists jobs (the caller's; all for administrators).
func (c *Client) JobList(ctx context.Context, p JobListParams) (JobListResult, error) {
	return RPCJobList.Call(ctx, c.c, p)
}

// JobCancel asks a job to stop.
func (c *Client) JobCancel(ctx context.Context, p JobRef) (Job, error) {
	return RPCJobCancel.Call(ctx, c.c, p)
}

// JobWatch opens a job.watch stream. It needs a *kite.Conn (streams belong to a connection).
// Read events with JobWatch.Next; Close it when done.
func (c *Client) JobWatch(ctx context.Context, p JobRef) (*JobWatch, error) {
	conn, ok := c.c.(*kite.Conn)
	if !ok {
		return nil, fmt.Errorf("%s needs a *kite.Conn, not %T", MethodJobWatch, c.c)
	}
	res, err := RPCJobWatch.Call(ctx, c.c, p)
	if err != nil {
		return nil, err
	}
	return &JobWatch{Job: res.Job, sub: conn.Subscribe(res.Subscription)}, nil
}

// JobWatch is an open job.watch stream.
type JobWatch struct {
	Job Job // the job when the watch began
	sub *kite.Subscription
}

// Next returns the next event. After the last one (the job ended) it returns an error wrapping
// kite.ErrStreamEnded.
func (w *JobWatch) Next(ctx context.Context) (JobEvent, error) {
	ev, err := w.sub.Next(ctx)
	if err != nil {
		return JobEvent{}, err
	}
	var je JobEvent
	if err := json.Unmarshal(ev.Data, &je); err != nil {
		return JobEvent{}, fmt.Errorf("%s: %w", NotifyJobEvent, err)
	}
	return je, nil
}

// Wait reads events until the job ends and returns the last one.
func (w *JobWatch) Wait(ctx context.Context) (JobEvent, error) {
	for {
		ev, err := w.Next(ctx)
		if err != nil {
			return ev, err
		}
		if ev.Status.Done() {
			return ev, nil
		}
	}
}

// Close stops the stream.
func (w *JobWatch) Close() { w.sub.Close() }

// EventWatch opens an event.watch stream. It needs a *kite.Conn (streams belong to a
// connection). Read events with EventWatch.Next; Close it when done.
func (c *Client) EventWatch(ctx context.Context, p EventWatchParams) (*EventWatch, error) {
	conn, ok := c.c.(*kite.Conn)
	if !ok {
		return nil, fmt.Errorf("%s needs a *kite.Conn, not %T", MethodEventWatch, c.c)
	}
	res, err := RPCEventWatch.Call(ctx, c.c, p)
	if err != nil {
		return nil, err
	}
	return &EventWatch{sub: conn.Subscribe(res.Subscription)}, nil
}

// EventWatch is an open event.watch stream.
type EventWatch struct{ sub *kite.Subscription }

// Next returns the next event.
func (w *EventWatch) Next(ctx context.Context) (Event, error) {
	ev, err := w.sub.Next(ctx)
	if err != nil {
		return Event{}, err
	}
	var e Event
	if err := json.Unmarshal(ev.Data, &e); err != nil {
		return Event{}, fmt.Errorf("%s: %w", NotifyEvent, err)
	}
	return e, nil
}

// Close stops the stream.
func (w *EventWatch) Close() { w.sub.Close() }

// BucketList is bucket.list.
func (c *Client) BucketList(ctx context.Context, p BucketListParams) (BucketListResult, error) {
	return RPCBucketList.Call(ctx, c.c, p)
}

// BucketCredentials is bucket.credentials.
func (c *Client) BucketCredentials(ctx context.Context, p BucketRef) (BucketCredentials, error) {
	return RPCBucketCredentials.Call(ctx, c.c, p)
}

// BucketGrant is bucket.grant.
func (c *Client) BucketGrant(ctx context.Context, p BucketGrantParams) (BucketView, error) {
	return RPCBucketGrant.Call(ctx, c.c, p)
}

// BucketRevoke is bucket.revoke.
func (c *Client) BucketRevoke(ctx context.Context, p BucketRevokeParams) (BucketView, error) {
	return RPCBucketRevoke.Call(ctx, c.c, p)
}

// BucketDelete is bucket.delete.
func (c *Client) BucketDelete(ctx context.Context, p BucketDeleteParams) (BucketView, error) {
	return RPCBucketDelete.Call(ctx, c.c, p)
}
