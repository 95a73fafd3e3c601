package ptype

import (
	"encoding/json"
	"fmt"
)

// State is a machine's infrastructure state.
type State string

// Machine states (Koding's machinestate, without the snapshot/resize ones).
const (
	Unknown        State = "Unknown"
	NotInitialized State = "NotInitialized"
	Building       State = "Building"
	Starting       State = "Starting"
	Running        State = "Running"
	Stopping       State = "Stopping"
	Stopped        State = "Stopped"
	Terminating    State = "Terminating"
	Terminated     State = "Terminated"
)

// States lists every state.
var States = []State{Unknown, NotInitialized, Building, Starting, Running, Stopping, Stopped, Terminating, Terminated}

// UnmarshalJSON accepts only known states ("" is Unknown).
func (s *State) UnmarshalJSON(b []byte) error {
	var v string
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	if v == "" {
		*s = Unknown
		return nil
	}
	for _, k := range States {
		if string(k) == v {
			*s = k
			return nil
		}
	}
	return fmt.Errorf("unknown machine state %q", v)
}

// InProgress reports whether s is a transition state.
func (s State) InProgress() bool {
	switch s {
	case Building, Starting, Stopping, Terminating:
		return true
	}
	return false
}

// Methods that change a machine's state.
const (
	MethodBuild   = "build"
	MethodStart   = "start"
	MethodStop    = "stop"
	MethodDestroy = "destroy"
)

// validMethods is Koding's allowed-method table: a method may run only from these states, and
// nothing runs while a transition is in progress.
var validMethods = map[State][]string{
	NotInitialized: {MethodBuild, MethodDestroy},
	Running:        {MethodStop, MethodDestroy},
	Stopped:        {MethodStart, MethodDestroy},
	Terminated:     {MethodBuild},
	Unknown:        {MethodDestroy},
}

// Allows reports whether method may run in state s.
func (s State) Allows(method string) bool {
	for _, m := range validMethods[s] {
		if m == method {
			return true
		}
	}
	return false
}

// FromStates returns the states method may run from.
func FromStates(method string) []State {
	var out []State
	for _, s := range States {
		if s.Allows(method) {
			out = append(out, s)
		}
	}
	return out
}

// Transition returns the in-progress and final states of method.
func Transition(method string) (during, after State) {
	switch method {
	case MethodBuild:
		return Building, Running
	case MethodStart:
		return Starting, Running
	case MethodStop:
		return Stopping, Stopped
	case MethodDestroy:
		return Terminating, Terminated
	}
	return Unknown, Unknown
}
