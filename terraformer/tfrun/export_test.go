package tfrun

// ReadStateFile is readStateFile, for the comparison with `terraform show` (statefile_test.go).
var ReadStateFile = readStateFile
