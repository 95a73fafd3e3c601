// Package api is kloud's RPC contract in Go: the name of every method kloud serves (methods.go),
// its params and result types (one file per area), its descriptor (rpc.go: Method[P, R], through
// which the typed client calls it and kloud's route table types its handler) and a typed client
// (client.go); the documents they carry are package kloud/model's (model.User, model.Stack, …).
// docs/protocol.md is the wire contract; a test in package kloud checks that every method kloud
// registers is a constant here and is documented there.
//
// Start with Client: api.NewClient(conn).StackApply(ctx, api.StackApplyParams{StackID: id})
// returns the job to watch.
//
// Ids: params name a thing by <kind>Id (stackId, machineId, templateId, credentialId, jobId);
// documents carry their own id as id. Params that named a thing id before (stack.describe,
// template.get/update/delete, credential.describe/remove/authenticate/bootstrap) still accept
// id for one release.
//
// This package imports neither kloud nor its store: a client links only the wire types.
package api
