// Package snapshots is the machine snapshot engine: machine.snapshot and machine.restore (durable
// jobs on the machine's lease, "machine/ID", so no start, stop or other snapshot runs
// meanwhile), machine.snapshots and snapshot.delete. The provider keeps the data
// (provider.Snapshotter); the store keeps a record per snapshot (kloud/store Snapshots) that
// belongs to the machine's owner and counts against the owner's quota ([Quota]). A provider
// snapshots and restores stopped machines only: the job stops a running machine first and
// starts it again after (waiting for its agent, as machine.start does), so the machine ends as
// it was.
//
// Snapshots outlive their machine and its stack: they stay listed, restorable into another
// machine of the same provider (machine.restore with machineId), and count against the quota
// until snapshot.delete, which asks the provider to delete the data through a machine built from
// what the record kept (the machine's attributes when the snapshot was taken).
//
// Start reading at [New] and [Options]: the engine gets what it needs of kloud through small
// interfaces (Machines: loading and changing machines, their provider's view; Leases: the
// machine's lease; Jobs: starting a durable job), never kloud's Server, and it does not import
// package kloud (a test keeps it so). kloud checks who calls and what they may do (its RPC
// handlers, kloud/snapshots.go), then calls the engine; its job kinds call [Engine.RunSnapshot]
// and [Engine.RunRestore].
package snapshots
