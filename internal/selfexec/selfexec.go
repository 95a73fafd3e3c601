// Package selfexec is what a program adds to the environment when it re-executes itself
// (/proc/self/exe) as a sandbox launcher or init: [Env]. Start reading there.
//
// A binary built with -race sleeps a second when it exits, so that other threads can still
// report a race (GORACE's atexit_sleep_ms, 1000 by default). The race-built test binaries re-execute
// themselves twice for every terraform command (launcher and init of internal/sandbox) and once
// for every machine boot and plugin start: that second was most of a terraform command's time in
// the tests. A re-execution of a race build gets atexit_sleep_ms=0; other builds get nothing.
package selfexec

import "os"

// Env returns the variables to add to the environment of a re-execution of this program: none,
// unless it is built with -race, then GORACE with atexit_sleep_ms=0 after what GORACE already says.
func Env() []string {
	if !raceEnabled {
		return nil
	}
	v := "atexit_sleep_ms=0"
	if cur := os.Getenv("GORACE"); cur != "" {
		v = cur + " " + v
	}
	return []string{"GORACE=" + v}
}
