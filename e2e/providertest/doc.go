// Package providertest is the provider conformance suite: one Run that any provider calls from
// its own tests to prove that it does what kloud expects of a provider, end to end, against its
// real infrastructure. It starts a real kloud (kloud/kloudtest) with the provider registered, a
// real terraformer (real terraform), and builds stacks whose machines run real klient agents;
// everything goes through kloud's typed API (kloud/api) as a user's CLI or browser would.
//
// Start reading at Config (what a provider gives the suite) and Run (the subtests, in order).
//
// # The subtests
//
//   - Describe: provider.describe names the provider, its kind and resource type; it is
//     available; every schema part is a JSON Schema 2020-12 of an object, agreeing with the
//     field lists, and the test credentials fit the credential's; its capabilities are the
//     provider's (Provider.Caps) and bootstrap goes with a bootstrap part.
//   - Credential: a good credential authenticates; a bad one is refused with the provider's
//     reason (Config.BadReason). Skipped for a provider that takes no credential.
//   - Bootstrap: credential.bootstrap builds the credential's shared resources; bootstrapping
//     again (the provider's bootstrap templates applied once more to the same Terraform state,
//     as kloud does after a failed or interrupted bootstrap) gives the same outputs and creates,
//     replaces or destroys nothing. Needs the bootstrap capability.
//   - Bucket: the provider's bucket provisioner (Provider.Buckets; kloud's proxy of a plugin's)
//     passes objstore/bucketcheck's contract against its real S3 server: each call twice, read
//     keys refused writes and revoked keys refused by the server itself, a half-done call
//     completed, concurrent Provisions making one bucket, Delete with and without retain (bucket.go).
//     Needs bucket.
//   - Stack: a stack of two machines (Config.Template) builds to Running with both agents
//     connected; Config.Leftovers sees its infrastructure.
//   - InfoBehindBack: a machine stopped behind kloud's back (Config.StopBehindBack): machine.info
//     says Stopped and the store agrees; machine.start brings it back. Needs info and start.
//   - StopStartKeepsDisk: a file written on the machine (Config.WriteFile) is still there after
//     machine.stop and machine.start (Config.ReadFile). Needs stop and start.
//   - Snapshot: machine.snapshot of a running machine leaves it running with its agent; a file
//     written after it is gone after machine.restore; restored into the other machine, the file
//     is there and that machine's own agent connects; snapshot.delete removes it (snapshot.go).
//     Needs snapshot.
//   - FirewallEnforced: the firewall blocks for real (firewall_enforced.go): a listener in the
//     stack's first machine, started through its agent's terminal; another user of the team
//     gets a stack of one machine (destroyed at the end). The owner's other machine and kloud's
//     host reach the listener, the other user's machine does not until a rule from any, team or
//     its address opens the port, and not again once it is closed; a rule for another network
//     or port, or a TCP rule for UDP, lets nothing in. Needs firewall; the machines need python3
//     (cloud-init's).
//   - UpdateKeepsPorts: rules opened on the first machine are there again after a stack update
//     to Config.ReplaceTemplate replaced it (update_ports.go). Needs firewall and
//     Config.ReplaceTemplate.
//   - InvalidInputs: bad credential JSON, an unknown field, a missing required field, an unknown
//     provider, machine.start of a running machine: each gets the right kite error code and a
//     message that says what is wrong.
//   - Destroy: stack destroy removes the machines, their agents and, with the credential's
//     bootstrap destroyed, everything (Config.Leftovers is empty).
//
// A subtest skips only when the provider does not advertise the capability it needs (kloud must
// then refuse the method with -32005, which the suite checks); what a provider advertises is
// checked against what its real stack and machines implement. Subtests after Stack need the stack:
// if Stack fails, they are skipped (the failure is Stack's).
//
// # Running it
//
// A provider's package gets one test (see providers/dummy/conformance_test.go and
// providers/local/conformance_test.go). Its TestMain must call tfsandbox.MaybeRun (terraform
// runs sandboxed through the test binary), and the test needs root (the sandbox) and the
// Terraform environment (`set -a; . /var/cache/kloud/env; set +a`):
//
//	func TestMain(m *testing.M) {
//		tfsandbox.MaybeRun()
//		os.Exit(m.Run())
//	}
//
//	func TestConformance(t *testing.T) {
//		cloud := mycloud.NewTestAccount(t) // the provider's real infrastructure
//		providertest.Run(t, providertest.Config{
//			Provider:       mycloud.New(mycloud.Options{Endpoint: cloud.URL}),
//			GoodCredential: json.RawMessage(`{"apiKey":"` + cloud.Key + `"}`),
//			BadCredential:  json.RawMessage(`{"apiKey":"revoked-key"}`),
//			BadReason:      "invalid API key",
//			Template: func(n int) map[string]string {
//				return map[string]string{"main.tf": fmt.Sprintf(`resource "mycloud_vm" "vm" { count = %d }`, n)}
//			},
//			StopBehindBack: func(t *testing.T, m providertest.Machine) { cloud.Stop(t, m.Attributes["id"].(string)) },
//			WriteFile:      func(t *testing.T, m providertest.Machine, path, data string) { cloud.Write(t, m, path, data) },
//			ReadFile:       func(t *testing.T, m providertest.Machine, path string) string { return cloud.Read(t, m, path) },
//			Leftovers:      func(t *testing.T) []string { return cloud.ListAll(t) },
//		})
//	}
//
// Run it like any test: `go test ./providers/mycloud -run TestConformance -count=1 -v`. With
// -v, the suite logs how long each step took (dummy: about 20 s, local: about 35 s).
//
// The hooks are the provider's own view of its infrastructure, deliberately not kloud's:
// StopBehindBack goes around kloud (the cloud's API, a kill), WriteFile and ReadFile reach the
// machine's disk (the provider's exec, or its directory), Leftovers lists everything the test's
// account or host holds. A provider whose Terraform provider is not in the offline mirror sets
// Config.Terraform (see providers/local: its kloudlocal is built into a mirror of its own); one
// whose machines reach kloud elsewhere than on loopback sets Config.Kloud.Addr; a module other
// than kloud's sets Config.Kloud.KlientBin (the suite builds ./cmd/klient of the module it runs
// in).
//
// A plugin provider (a kloud-provider-NAME binary whose main calls plugin.Serve) sets
// Config.Plugin (the binary's path, e.g. testutil.BuildBinary's) and Config.Name instead of
// Config.Provider; everything else is the same. The suite copies the binary into the test
// kloud's plugin directory, kloud's launcher starts it (sandboxed as uid 65534, with its state
// directory <data dir>/plugin-state/NAME: set Config.Kloud.DataDir to find its machines from
// the hooks; Config.Kloud.Plugins changes the launcher's options), the suite waits for it to
// register and then tests kloud's proxy of it, over the plugin's connection. A provider best
// runs the suite both ways (examples/provider-example does):
//
//	t.Run("Plugin", func(t *testing.T) {
//		data := t.TempDir()
//		c := config(filepath.Join(data, "plugin-state", "mycloud"))
//		c.Plugin, c.Name = testutil.BuildBinary(t, "./cmd/kloud-provider-mycloud"), "mycloud"
//		c.Kloud.DataDir = data
//		providertest.Run(t, c)
//	})
package providertest
