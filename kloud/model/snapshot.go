package model

import "time"

// Snapshot statuses (Snapshot.Status).
const (
	SnapshotCreating = "creating" // the machine.snapshot job is saving it
	SnapshotReady    = "ready"
	SnapshotFailed   = "failed" // kept with its error until deleted; holds no data
)

// Snapshot is a saved disk of a machine (collection snapshots): kloud's record of what a
// provider keeps under ID (provider.Snapshotter). It belongs to the machine's owner and counts
// against the owner's quota; it outlives the machine and its stack (restorable into another
// machine of the same provider until snapshot.delete).
type Snapshot struct {
	ID           string `bson:"_id" json:"id"`
	Name         string `bson:"name" json:"name"`
	Owner        string `bson:"owner" json:"owner"`
	Team         string `bson:"team" json:"team"`
	MachineID    string `bson:"machineId" json:"machineId"`
	MachineLabel string `bson:"machineLabel" json:"machineLabel"`
	StackID      string `bson:"stackId" json:"stackId"`
	Provider     string `bson:"provider" json:"provider"`
	Status       string `bson:"status" json:"status"`
	Error        string `bson:"error,omitempty" json:"error,omitempty"`
	// Size is what the provider keeps (bytes, counted against the quota); DiskSize the data
	// saved before compression.
	Size     int64  `bson:"size" json:"size"`
	DiskSize int64  `bson:"diskSize,omitempty" json:"diskSize,omitempty"`
	Format   string `bson:"format,omitempty" json:"format,omitempty"`
	JobID    string `bson:"jobId,omitempty" json:"jobId,omitempty"`
	// The machine as the provider knew it when the snapshot was taken: kloud builds the
	// provider's machine from it to delete the snapshot after the machine is gone.
	KiteID     string         `bson:"kiteId,omitempty" json:"-"`
	Attributes map[string]any `bson:"attributes,omitempty" json:"-"`
	CreatedAt  time.Time      `bson:"createdAt" json:"createdAt"`
	UpdatedAt  time.Time      `bson:"updatedAt" json:"updatedAt"`
}
