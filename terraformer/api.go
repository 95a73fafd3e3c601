package terraformer

import (
	"github.com/kloud-dev/kloud/terraformer/tfapi"
	"github.com/kloud-dev/kloud/terraformer/tfrun"
)

// The wire types of terraformer's methods are in terraformer/tfapi (what kloud links); these are
// their names here, for the service and its tests.

// Name is the kite name of terraformer.
const Name = tfapi.Name

// The methods terraformer serves, and the notification method of its streams.
const (
	MethodPlan    = tfapi.MethodPlan
	MethodApply   = tfapi.MethodApply
	MethodDestroy = tfapi.MethodDestroy
	MethodJob     = tfapi.MethodJob
	MethodWatch   = tfapi.MethodWatch
	MethodCancel  = tfapi.MethodCancel
	MethodState   = tfapi.MethodState
	MethodOutputs = tfapi.MethodOutputs
	EventMethod   = tfapi.EventMethod
)

// Limits on Request, checked before anything reaches the engine.
const (
	MaxFiles      = tfapi.MaxFiles
	MaxTraceIDLen = tfapi.MaxTraceIDLen
)

// The params and results of terraformer's methods, and the data of terraformer.event.
type (
	Event         = tfapi.Event
	Request       = tfapi.Request
	SubmitResult  = tfapi.SubmitResult
	JobParams     = tfapi.JobParams
	WatchResult   = tfapi.WatchResult
	ContentParams = tfapi.ContentParams
	StateResult   = tfapi.StateResult
	OutputsResult = tfapi.OutputsResult
)

func engineRequest(r *Request, op tfrun.Op) tfrun.Request {
	req := tfrun.Request{Op: op, ContentID: r.ContentID, Variables: r.Variables, TraceID: r.TraceID, Preview: r.Preview}
	if len(r.Files) > 0 {
		req.Files = make(map[string][]byte, len(r.Files))
		for name, content := range r.Files {
			req.Files[name] = []byte(content)
		}
	}
	return req
}
