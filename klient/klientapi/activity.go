package klientapi

import "time"

// MethodActivity reports what the machine does that kloud does not see (kloud's idle stop,
// kloud/idle.go): the CPU its terminal sessions use. kloud calls it over the agent's
// registration connection; only kloud may (its own kite).
const MethodActivity = "klient.activity"

// FeatureActivity is in Info.Features of a klient that serves klient.activity.
const FeatureActivity = "activity"

// Activity is the result of klient.activity.
type Activity struct {
	// CPUSeconds is the CPU time (user and system) used since klient started by the processes
	// klient started (terminal sessions and what runs in them, also after they left the
	// terminal, unless they left klient's process tree); it only grows. kloud compares two
	// readings: more than its threshold (a share of one CPU) between them is activity.
	CPUSeconds float64 `json:"cpuSeconds"`
	// Processes is how many of those processes run now.
	Processes int       `json:"processes"`
	At        time.Time `json:"at"`
}
