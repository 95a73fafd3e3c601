package provider

import "github.com/kloud-dev/kloud/provider/ptype"

// The contract's value types are package ptype's (provider/ptype: standard library only, so that
// kloud/api and the plugin protocol link them without this package); a provider names them here.

// Machine states (ptype/state.go).
type State = ptype.State

// Machine states (Koding's machinestate, without the snapshot/resize ones).
const (
	Unknown        = ptype.Unknown
	NotInitialized = ptype.NotInitialized
	Building       = ptype.Building
	Starting       = ptype.Starting
	Running        = ptype.Running
	Stopping       = ptype.Stopping
	Stopped        = ptype.Stopped
	Terminating    = ptype.Terminating
	Terminated     = ptype.Terminated
)

// States lists every state.
var States = ptype.States

// Methods that change a machine's state.
const (
	MethodBuild   = ptype.MethodBuild
	MethodStart   = ptype.MethodStart
	MethodStop    = ptype.MethodStop
	MethodDestroy = ptype.MethodDestroy
)

// FromStates returns the states method may run from.
func FromStates(method string) []State { return ptype.FromStates(method) }

// Transition returns the in-progress and final states of method.
func Transition(method string) (during, after State) { return ptype.Transition(method) }

// Capability is something a provider can do (ptype/capability.go; Provider.Caps).
type Capability = ptype.Capability

// Capabilities.
const (
	CapStart         = ptype.CapStart
	CapStop          = ptype.CapStop
	CapInfo          = ptype.CapInfo
	CapConsoleLog    = ptype.CapConsoleLog  // Machine implements ConsoleLogger
	CapResize        = ptype.CapResize      // Machine implements Resizer
	CapConstraints   = ptype.CapConstraints // Stack implements ConstraintsValidator
	CapBootstrap     = ptype.CapBootstrap   // Schema.NewBootstrap != nil / bootstrap templates
	CapSnapshot      = ptype.CapSnapshot    // Machine implements Snapshotter (snapshot.go)
	CapFirewall      = ptype.CapFirewall    // Machine implements Firewaller (firewall.go)
	CapResources     = ptype.CapResources   // Provider.Inventory is set (resources.go)
	CapTemplateRules = ptype.CapTemplateRules
	CapBucket        = ptype.CapBucket // Provider.Buckets is set (bucket.go)
)

// Object buckets (ptype/bucket.go; BucketProvisioner).
type (
	BucketAccess = ptype.BucketAccess
	BucketClaim  = ptype.BucketClaim
	Bucket       = ptype.Bucket
	BucketKey    = ptype.BucketKey
)

// Bucket accesses.
const (
	BucketRead  = ptype.BucketRead
	BucketWrite = ptype.BucketWrite
)

// ValidBucketName checks a bucket name against S3's naming rules (ptype/bucket.go).
func ValidBucketName(name string) error { return ptype.ValidBucketName(name) }

// PortRule opens Port/Protocol of a machine to From (ptype/firewall.go; Firewaller).
type PortRule = ptype.PortRule

// Sources a rule opens a port to (PortRule.From), besides an IPv4 CIDR.
const (
	FromKloud = ptype.FromKloud
	FromOwner = ptype.FromOwner
	FromTeam  = ptype.FromTeam
	FromAny   = ptype.FromAny
)

// Resource is one thing a provider created for kloud (ptype/resources.go; ResourceManager).
type Resource = ptype.Resource

// provider.describe's entry for a provider and its parts (ptype/describe.go; Describe).
type (
	Description = ptype.Description
	Schemas     = ptype.Schemas
	Field       = ptype.Field
)

// Kinds of provider (Description.Kind).
const (
	KindBuiltin = ptype.KindBuiltin
	KindPlugin  = ptype.KindPlugin
)

// The constraints vocabulary (ptype/constraints.go).
type (
	Constraint      = ptype.Constraint
	ConstraintError = ptype.ConstraintError
)

// Constraint names: Juju's vocabulary. A provider may declare others.
const (
	ConstraintCores        = ptype.ConstraintCores
	ConstraintMem          = ptype.ConstraintMem
	ConstraintDisk         = ptype.ConstraintDisk
	ConstraintArch         = ptype.ConstraintArch
	ConstraintZone         = ptype.ConstraintZone
	ConstraintTags         = ptype.ConstraintTags
	ConstraintInstanceType = ptype.ConstraintInstanceType
)

// Types of constraint values (Constraint.Type).
const (
	ConstraintInteger = ptype.ConstraintInteger
	ConstraintNumber  = ptype.ConstraintNumber
	ConstraintString  = ptype.ConstraintString
	ConstraintList    = ptype.ConstraintList
	ConstraintMap     = ptype.ConstraintMap
)

// ErrConstraint is what every *ConstraintError is (errors.Is).
var ErrConstraint = ptype.ErrConstraint

// Bounds returns a pointer to v, for Constraint.Min and Max.
func Bounds(v float64) *float64 { return ptype.Bounds(v) }

// LookupConstraint returns the constraint called name, or nil.
func LookupConstraint(vocab []Constraint, name string) *Constraint {
	return ptype.LookupConstraint(vocab, name)
}

// CheckVocabulary reports what is wrong with a vocabulary (ptype.CheckVocabulary).
func CheckVocabulary(vocab []Constraint) error { return ptype.CheckVocabulary(vocab) }

// ValidateConstraints checks a machine's planned attributes against vocab
// (ptype.ValidateConstraints).
func ValidateConstraints(vocab []Constraint, attrs map[string]any) error {
	return ptype.ValidateConstraints(vocab, attrs)
}

// NearestString returns the value of values nearest to s (ptype.NearestString).
func NearestString(values []string, s string) string { return ptype.NearestString(values, s) }

// Number reads a number as a plan's JSON gives it (float64), or as Go code does (ptype.Number).
func Number(v any) (float64, bool) { return ptype.Number(v) }
