package ptype

// Capability is something a provider can do beyond the required Stack and Machine methods, or
// one of those it may choose not to offer (provider.Provider.Caps).
type Capability string

// Capabilities. The interfaces named are package provider's.
const (
	CapStart       Capability = "start"
	CapStop        Capability = "stop"
	CapInfo        Capability = "info"
	CapConsoleLog  Capability = "consoleLog"  // Machine implements ConsoleLogger
	CapResize      Capability = "resize"      // Machine implements Resizer
	CapConstraints Capability = "constraints" // Stack implements ConstraintsValidator
	CapBootstrap   Capability = "bootstrap"   // Schema.NewBootstrap != nil / bootstrap templates
	// snap (issue 13): Machine implements Snapshotter
	CapSnapshot Capability = "snapshot"
	CapFirewall Capability = "firewall" // Machine implements Firewaller
	// CapResources: the provider lists the resources it created with kloud's tags and removes
	// one (Provider.Inventory is set). Without it, kloud gc skips the provider.
	CapResources Capability = "resources"
	// CapTemplateRules: the Stack implements TemplateValidator.
	CapTemplateRules Capability = "templateRules"
	// CapBucket: the provider provisions object buckets (Provider.Buckets is set; bucket.go).
	CapBucket Capability = "bucket"
)
