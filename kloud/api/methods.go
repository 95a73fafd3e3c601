package api

import "github.com/kloud-dev/kloud/provider/pluginapi"

// Methods kloud serves (docs/protocol.md "kloud: …"). Every caller must be an authenticated
// user; machine agents (kite ids starting "agent.") may call none of them.
const (
	MethodVersion = "kloud.version"

	MethodUserAdd          = "user.add"
	MethodUserList         = "user.list"
	MethodUserWhoami       = "user.whoami"
	MethodUserSetPassword  = "user.setPassword"
	MethodUserSetRole      = "user.setRole" // roles: owners only
	MethodTeamCreate       = "team.create"
	MethodTeamList         = "team.list"
	MethodTeamAddMember    = "team.addMember"
	MethodTeamRemoveMember = "team.removeMember"

	MethodProviderDescribe       = "provider.describe"
	MethodCredentialAdd          = "credential.add"
	MethodCredentialList         = "credential.list"
	MethodCredentialDescribe     = "credential.describe"
	MethodCredentialRemove       = "credential.remove"
	MethodCredentialAuthenticate = "credential.authenticate"
	MethodCredentialBootstrap    = "credential.bootstrap"
	MethodCredentialUpdate       = "credential.update"

	MethodProviderList      = "provider.list"
	MethodProviderKeyCreate = "provider.keyCreate"
	// MethodPluginRegister is called by provider plugins only (plugin keys), never by users.
	MethodPluginRegister = pluginapi.MethodRegister

	MethodTemplateCreate     = "template.create"
	MethodTemplateUpdate     = "template.update"
	MethodTemplateGet        = "template.get"
	MethodTemplateList       = "template.list"
	MethodTemplateDelete     = "template.delete"
	MethodTemplateTrust      = "template.trust"
	MethodTemplateUntrust    = "template.untrust"
	MethodTemplateParameters = "template.parameters"

	MethodStackPlan     = "stack.plan"
	MethodStackPlanJob  = "stack.planJob" // stack.plan as a job (stacks_plan.go)
	MethodStackCreate   = "stack.create"
	MethodStackApply    = "stack.apply"
	MethodStackDescribe = "stack.describe"
	MethodStackList     = "stack.list"
	MethodStackReset    = "stack.reset"

	MethodMachineList    = "machine.list"
	MethodMachineInfo    = "machine.info"
	MethodMachineStart   = "machine.start"
	MethodMachineStop    = "machine.stop"
	MethodMachineShare   = "machine.share"
	MethodMachineUnshare = "machine.unshare"
	MethodMachineShares  = "machine.shares"
	// agents.go: the machine's klient replaced by the one kloud serves, sessions kept
	MethodMachineUpgradeAgent = "machine.upgradeAgent"

	// snapshots.go
	MethodMachineSnapshot  = "machine.snapshot"
	MethodMachineSnapshots = "machine.snapshots"
	MethodMachineRestore   = "machine.restore"
	MethodSnapshotDelete   = "snapshot.delete"

	// stackupdate.go (issue 13 §1)
	MethodStackUpdate = "stack.update"
	MethodStackScale  = "stack.scale"

	MethodJobGet    = "job.get"
	MethodJobWatch  = "job.watch"
	MethodJobList   = "job.list"
	MethodJobCancel = "job.cancel"

	// eventfeed.go (issue 22 §4): what changed, as a stream
	MethodEventWatch = "event.watch"
)

// Garbage collection (gc.go): kloud administrators collect the garbage of providers that list
// their resources (capability "resources"): resources of this kloud instance whose stack or
// machine kloud no longer has, or that a build which died left out of the stack's Terraform state.
const MethodGCRun = "gc.run"

// Notifications kloud sends.
const (
	// NotifyJobEvent carries a JobEvent on the stream job.watch opens.
	NotifyJobEvent = "job.event"
	// NotifyEvent carries an Event on the stream event.watch opens.
	NotifyEvent = "event.notify"
)

// Methods of the kontrol kloud hosts (package kontrol serves them; docs/protocol.md "kontrol").
const (
	MethodKontrolRegister  = "kontrol.register"
	MethodKontrolQuery     = "kontrol.query"
	MethodKontrolGetToken  = "kontrol.getToken"
	MethodKontrolGetKey    = "kontrol.getKey"
	MethodKontrolCreateKey = "kontrol.createKey"
	MethodKontrolRotateKey = "kontrol.rotateKey"
	MethodKontrolRetireKey = "kontrol.retireKey"
	MethodKontrolRevoke    = "kontrol.revoke"
)

// KloudMethods lists kloud's own methods, sorted.
func KloudMethods() []string {
	return []string{
		MethodAuditList, MethodAuditVerify, // audit.go
		MethodBucketCredentials, MethodBucketDelete, MethodBucketGrant, MethodBucketList, MethodBucketRevoke, // buckets.go
		MethodCredentialAdd, MethodCredentialAuthenticate, MethodCredentialBootstrap, MethodCredentialDescribe,
		MethodCredentialList, MethodCredentialRemove, MethodCredentialUpdate,
		MethodEventWatch, // eventfeed.go
		MethodGCRun,      // gc.go
		MethodJobCancel, MethodJobGet, MethodJobList, MethodJobWatch,
		MethodKloudDoctor, // doctor.go
		MethodVersion,
		MethodMachineInfo, MethodMachineList,
		MethodMachinePortsClose, MethodMachinePortsList, MethodMachinePortsOpen, // ports.go
		MethodMachineRestore,
		MethodMachineSet, // idle.go
		MethodMachineShare, MethodMachineShares,
		MethodMachineSnapshot, MethodMachineSnapshots, MethodMachineStart, MethodMachineStop, MethodMachineUnshare,
		MethodMachineUpgradeAgent, // agents.go
		MethodPluginRegister,
		MethodPoolDelete, MethodPoolList, MethodPoolSet, // pools.go
		MethodProviderDescribe, MethodProviderKeyCreate, MethodProviderList,
		MethodQuotaSet, MethodQuotaShow, // quota.go
		MethodReplicaAgentCall, MethodReplicaPluginCall, // replicas.go: replicas only (kloud/mesh.go)
		MethodSnapshotDelete,
		MethodStackApply, MethodStackCreate, MethodStackDescribe, MethodStackList, MethodStackPlan, MethodStackPlanJob, MethodStackReset,
		MethodStackScale, MethodStackUpdate,
		MethodTeamAddMember, MethodTeamCreate, MethodTeamList, MethodTeamRemoveMember,
		MethodTemplateCreate, MethodTemplateDelete, MethodTemplateGet, MethodTemplateList,
		MethodTemplateParameters, // params.go
		MethodTemplateTrust, MethodTemplateUntrust, MethodTemplateUpdate,
		MethodUserAdd, MethodUserList, MethodUserSetPassword, MethodUserSetRole, MethodUserWhoami,
	}
}

// KontrolMethods lists the kontrol methods kloud hosts, sorted.
func KontrolMethods() []string {
	return []string{
		MethodKontrolCreateKey, MethodKontrolGetKey, MethodKontrolGetToken, MethodKontrolQuery,
		MethodKontrolRegister, MethodKontrolRetireKey, MethodKontrolRevoke, MethodKontrolRotateKey,
	}
}
