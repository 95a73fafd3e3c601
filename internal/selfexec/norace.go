//go:build !race

package selfexec

const raceEnabled = false
