package api

import (
	"context"
	"reflect"

	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/provider/pluginapi"
)

// Method describes one kloud method: its name and the Go types of its params (P) and result
// (R). The typed client calls through it (Call) and kloud's route table registers its handler
// through it (kloud/routes.go rpc), so a handler whose result type is not the client's does
// not compile. Every method kloud serves has one below, named RPC + its Method* constant's
// name (RPCStackList is stack.list); Descriptors lists them for the route table's test.
type Method[P, R any] struct {
	Name string // the Method* constant: docs/protocol.md, the audit table and tests name it
}

// Call calls the method on c (a *kite.Conn or *kite.Client) and decodes its result.
func (m Method[P, R]) Call(ctx context.Context, c Caller, p P) (R, error) {
	var r R
	err := c.Call(ctx, m.Name, p, &r)
	return r, err
}

// MethodName returns the method's name.
func (m Method[P, R]) MethodName() string { return m.Name }

// ParamsType returns the Go type of the method's params.
func (m Method[P, R]) ParamsType() reflect.Type { return reflect.TypeFor[P]() }

// ResultType returns the Go type the client decodes the method's result into.
func (m Method[P, R]) ResultType() reflect.Type { return reflect.TypeFor[R]() }

// Descriptor is a Method of any types (Descriptors' values).
type Descriptor interface {
	MethodName() string
	ParamsType() reflect.Type
	ResultType() reflect.Type
}

// PluginRegisterResult is plugin.register's result (provider/plugin decodes it as
// pluginapi.RegisterResult).
type PluginRegisterResult = pluginapi.RegisterResult

// The methods kloud serves (KloudMethods), sorted as there.
var (
	RPCAuditList              = Method[AuditListParams, AuditListResult]{Name: MethodAuditList}
	RPCAuditVerify            = Method[NoParams, AuditVerifyResult]{Name: MethodAuditVerify}
	RPCCredentialAdd          = Method[CredentialAddParams, CredentialAddResult]{Name: MethodCredentialAdd}
	RPCCredentialAuthenticate = Method[CredentialRef, AuthenticateResult]{Name: MethodCredentialAuthenticate}
	RPCCredentialBootstrap    = Method[CredentialBootstrapParams, BootstrapResult]{Name: MethodCredentialBootstrap}
	RPCCredentialDescribe     = Method[CredentialRef, CredentialView]{Name: MethodCredentialDescribe}
	RPCCredentialList         = Method[CredentialListParams, CredentialListResult]{Name: MethodCredentialList}
	RPCCredentialRemove       = Method[CredentialRef, CredentialRemoveResult]{Name: MethodCredentialRemove}
	RPCCredentialUpdate       = Method[CredentialUpdateParams, CredentialUpdateResult]{Name: MethodCredentialUpdate}
	RPCGCRun                  = Method[GCRunParams, GCResult]{Name: MethodGCRun}
	RPCJobCancel              = Method[JobRef, Job]{Name: MethodJobCancel}
	RPCBucketCredentials      = Method[BucketRef, BucketCredentials]{Name: MethodBucketCredentials}
	RPCBucketDelete           = Method[BucketDeleteParams, BucketView]{Name: MethodBucketDelete}
	RPCBucketGrant            = Method[BucketGrantParams, BucketView]{Name: MethodBucketGrant}
	RPCBucketList             = Method[BucketListParams, BucketListResult]{Name: MethodBucketList}
	RPCBucketRevoke           = Method[BucketRevokeParams, BucketView]{Name: MethodBucketRevoke}
	RPCJobGet                 = Method[JobRef, Job]{Name: MethodJobGet}
	RPCJobList                = Method[JobListParams, JobListResult]{Name: MethodJobList}
	RPCJobWatch               = Method[JobRef, JobWatchResult]{Name: MethodJobWatch}
	RPCEventWatch             = Method[EventWatchParams, EventWatchResult]{Name: MethodEventWatch}
	RPCKloudDoctor            = Method[NoParams, DoctorResult]{Name: MethodKloudDoctor}
	RPCVersion                = Method[NoParams, VersionResult]{Name: MethodVersion}
	RPCMachineInfo            = Method[MachineRef, MachineInfo]{Name: MethodMachineInfo}
	RPCMachineList            = Method[MachineListParams, MachineListResult]{Name: MethodMachineList}
	RPCMachinePortsClose      = Method[PortsParams, PortsResult]{Name: MethodMachinePortsClose}
	RPCMachinePortsList       = Method[MachineRef, PortsResult]{Name: MethodMachinePortsList}
	RPCMachinePortsOpen       = Method[PortsParams, PortsResult]{Name: MethodMachinePortsOpen}
	RPCMachineRestore         = Method[RestoreParams, JobRef]{Name: MethodMachineRestore}
	RPCMachineSet             = Method[MachineSetParams, model.Machine]{Name: MethodMachineSet}
	RPCMachineShare           = Method[ShareParams, SharesResult]{Name: MethodMachineShare}
	RPCMachineShares          = Method[MachineRef, SharesResult]{Name: MethodMachineShares}
	RPCMachineSnapshot        = Method[SnapshotParams, SnapshotStarted]{Name: MethodMachineSnapshot}
	RPCMachineSnapshots       = Method[SnapshotsParams, SnapshotsResult]{Name: MethodMachineSnapshots}
	RPCMachineStart           = Method[MachineRef, JobRef]{Name: MethodMachineStart}
	RPCMachineStop            = Method[MachineRef, JobRef]{Name: MethodMachineStop}
	RPCMachineUnshare         = Method[ShareParams, SharesResult]{Name: MethodMachineUnshare}
	RPCPluginRegister         = Method[PluginRegisterParams, PluginRegisterResult]{Name: MethodPluginRegister}
	RPCPoolDelete             = Method[PoolRef, DeleteResult]{Name: MethodPoolDelete}
	RPCPoolList               = Method[PoolListParams, PoolListResult]{Name: MethodPoolList}
	RPCPoolSet                = Method[PoolSetParams, PoolView]{Name: MethodPoolSet}
	RPCProviderDescribe       = Method[ProviderDescribeParams, ProviderDescribeResult]{Name: MethodProviderDescribe}
	RPCProviderKeyCreate      = Method[ProviderKeyCreateParams, ProviderKeyCreateResult]{Name: MethodProviderKeyCreate}
	RPCProviderList           = Method[NoParams, ProviderListResult]{Name: MethodProviderList}
	RPCQuotaSet               = Method[QuotaSetParams, QuotaStatus]{Name: MethodQuotaSet}
	RPCQuotaShow              = Method[QuotaShowParams, QuotaStatus]{Name: MethodQuotaShow}
	RPCSnapshotDelete         = Method[SnapshotRef, model.Snapshot]{Name: MethodSnapshotDelete}
	RPCStackApply             = Method[StackApplyParams, JobRef]{Name: MethodStackApply}
	RPCStackCreate            = Method[StackPlanParams, StackCreateResult]{Name: MethodStackCreate}
	RPCStackDescribe          = Method[StackRef, StackView]{Name: MethodStackDescribe}
	RPCStackList              = Method[StackListParams, StackListResult]{Name: MethodStackList}
	RPCStackPlan              = Method[StackPlanParams, StackPlanResult]{Name: MethodStackPlan}
	RPCStackPlanJob           = Method[StackPlanParams, JobRef]{Name: MethodStackPlanJob}
	RPCStackReset             = Method[StackResetParams, StackView]{Name: MethodStackReset}
	RPCStackScale             = Method[StackScaleParams, JobRef]{Name: MethodStackScale}
	RPCStackUpdate            = Method[StackUpdateParams, JobRef]{Name: MethodStackUpdate}
	RPCTeamAddMember          = Method[TeamMemberParams, model.Team]{Name: MethodTeamAddMember}
	RPCTeamCreate             = Method[TeamCreateParams, model.Team]{Name: MethodTeamCreate}
	RPCTeamList               = Method[NoParams, TeamListResult]{Name: MethodTeamList}
	RPCTeamRemoveMember       = Method[TeamMemberParams, model.Team]{Name: MethodTeamRemoveMember}
	RPCTemplateCreate         = Method[TemplateParams, model.Template]{Name: MethodTemplateCreate}
	RPCTemplateDelete         = Method[TemplateRef, DeleteResult]{Name: MethodTemplateDelete}
	RPCTemplateGet            = Method[TemplateGetParams, TemplateView]{Name: MethodTemplateGet}
	RPCTemplateList           = Method[TemplateListParams, TemplateListResult]{Name: MethodTemplateList}
	RPCTemplateParameters     = Method[TemplateGetParams, TemplateParametersResult]{Name: MethodTemplateParameters}
	RPCTemplateTrust          = Method[TrustParams, model.TemplateTrust]{Name: MethodTemplateTrust}
	RPCTemplateUntrust        = Method[TrustParams, UntrustResult]{Name: MethodTemplateUntrust}
	RPCTemplateUpdate         = Method[TemplateParams, model.Template]{Name: MethodTemplateUpdate}
	RPCUserAdd                = Method[UserAddParams, UserView]{Name: MethodUserAdd}
	RPCUserList               = Method[NoParams, UserListResult]{Name: MethodUserList}
	RPCUserSetPassword        = Method[SetPasswordParams, SetPasswordResult]{Name: MethodUserSetPassword}
	RPCUserSetRole            = Method[SetRoleParams, UserView]{Name: MethodUserSetRole}
	RPCUserWhoami             = Method[NoParams, WhoamiResult]{Name: MethodUserWhoami}
	RPCMachineUpgradeAgent    = Method[MachineRef, UpgradeAgentResult]{Name: MethodMachineUpgradeAgent}
)

// Descriptors returns the descriptor of every method kloud serves, by name (a new map each call).
func Descriptors() map[string]Descriptor {
	ds := []Descriptor{
		RPCAuditList, RPCAuditVerify, RPCBucketCredentials, RPCBucketDelete, RPCBucketGrant, RPCBucketList,
		RPCBucketRevoke, RPCCredentialAdd, RPCCredentialAuthenticate, RPCCredentialBootstrap,
		RPCCredentialDescribe, RPCCredentialList, RPCCredentialRemove, RPCCredentialUpdate, RPCGCRun, RPCJobCancel,
		RPCEventWatch,
		RPCJobGet, RPCJobList, RPCJobWatch, RPCKloudDoctor, RPCVersion, RPCMachineInfo, RPCMachineList,
		RPCMachinePortsClose, RPCMachinePortsList, RPCMachinePortsOpen, RPCMachineRestore, RPCMachineSet,
		RPCMachineShare, RPCMachineShares, RPCMachineSnapshot, RPCMachineSnapshots, RPCMachineStart,
		RPCMachineStop, RPCMachineUnshare, RPCPluginRegister, RPCPoolDelete, RPCPoolList, RPCPoolSet, RPCProviderDescribe, RPCProviderKeyCreate,
		RPCProviderList, RPCQuotaSet, RPCQuotaShow, RPCReplicaAgentCall, RPCReplicaPluginCall, RPCSnapshotDelete, RPCStackApply, RPCStackCreate,
		RPCStackDescribe, RPCStackList, RPCStackPlan, RPCStackPlanJob, RPCStackReset, RPCStackScale,
		RPCStackUpdate, RPCTeamAddMember, RPCTeamCreate, RPCTeamList, RPCTeamRemoveMember, RPCTemplateCreate,
		RPCTemplateDelete, RPCTemplateGet, RPCTemplateList, RPCTemplateTrust, RPCTemplateUntrust,
		RPCTemplateParameters,
		RPCTemplateUpdate, RPCUserAdd, RPCUserList, RPCUserSetPassword, RPCUserSetRole, RPCUserWhoami,
		RPCMachineUpgradeAgent,
	}
	out := make(map[string]Descriptor, len(ds))
	for _, d := range ds {
		out[d.MethodName()] = d
	}
	return out
}
