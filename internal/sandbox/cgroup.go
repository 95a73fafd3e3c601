package sandbox

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"time"

	"github.com/kloud-dev/kloud/internal/cgroups"
)

// Cgroups. With Config.Limits the launcher creates kloud/<CgroupPrefix><run token> (internal/
// cgroups: memory, cpu and pids on v1, v2 or hybrid hosts), joins it before it starts init, so
// that init, terraform (or a plugin) and everything they start are under its limits, and removes
// it when init has ended. A launcher killed before that leaves an empty group: [RemoveCgroup]
// (the caller, after the command) and [RemoveLeftovers] (at start) remove it.

// Default cgroup name prefixes: terraform runs (terraformer) and provider plugins (kloud).
const (
	CgroupPrefixTerraform = "tf-"
	CgroupPrefixPlugin    = "kp-"
)

// DefaultTerraformLimits and DefaultPluginLimits are the limits terraformer serve and kloud
// serve use unless told otherwise (--terraform-* and --plugin-* flags).
var (
	DefaultTerraformLimits = cgroups.Limits{CPUs: 1, MemoryBytes: 2 << 30, PidsMax: 1024}
	DefaultPluginLimits    = cgroups.Limits{CPUs: 1, MemoryBytes: 512 << 20, PidsMax: 512}
)

// cgroupName is the group of run for config c.
func (c *Config) cgroupName(run string) string {
	prefix := c.CgroupPrefix
	if prefix == "" {
		prefix = CgroupPrefixTerraform
	}
	clean := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
			return r
		}
		return '_'
	}, prefix+run)
	return "kloud/" + clean
}

// joinCgroup creates the launcher's group and moves the launcher into it. A group removed by
// another process's RemoveLeftovers while it was made, or before the launcher joined it, is made
// again.
func joinCgroup(cfg *Config, rel string) error {
	var err error
	for range 3 {
		var procs []string
		if procs, err = cgroups.Create(rel, *cfg.Limits); errors.Is(err, fs.ErrNotExist) {
			continue // removed between its mkdir and its limits
		} else if err != nil {
			return err
		}
		if err = cgroups.Join(procs, 0); err == nil {
			return nil
		}
	}
	return err
}

// leaveCgroup moves the launcher out of its group, kills whatever is left in it and removes it.
func leaveCgroup(rel string) error {
	if err := cgroups.Leave(); err != nil {
		return err
	}
	if !cgroups.KillAll(rel, 5*time.Second) {
		return fmt.Errorf("cgroup %s: processes left", rel)
	}
	return cgroups.Remove(rel)
}

// RemoveCgroup removes the group of command run (Config c, as given to Env) if its launcher did
// not (it was killed): kills what is left in it, then removes it. A no-op without Limits.
func RemoveCgroup(c Config, run string) error {
	if c.Limits == nil || c.Insecure || run == "" {
		return nil
	}
	rel := c.cgroupName(run)
	if !cgroups.KillAll(rel, 5*time.Second) {
		return fmt.Errorf("cgroup %s: processes left", rel)
	}
	return cgroups.Remove(rel)
}

// RemoveLeftovers removes the empty groups named with prefix (CgroupPrefixTerraform,
// CgroupPrefixPlugin) that killed launchers left; groups with processes (another program's
// runs) are left alone. It returns the groups it removed.
func RemoveLeftovers(prefix string) ([]string, error) {
	return RemoveLeftoversOlder(prefix, time.Minute)
}

// RemoveLeftoversOlder is RemoveLeftovers of the empty groups made more than age ago (a group
// made since may be one whose launcher has not joined it yet).
func RemoveLeftoversOlder(prefix string, age time.Duration) ([]string, error) {
	if prefix == "" || os.Geteuid() != 0 {
		return nil, nil
	}
	var removed []string
	var err error
	for _, rel := range cgroups.Orphans(prefix) {
		// A group with processes is another program's run; so may be a young one: its
		// launcher may not have joined it yet (ci52: a terraformer starting removed another's
		// new group before its limits were written).
		if len(cgroups.PIDs(rel)) > 0 || cgroups.Age(rel) < age {
			continue
		}
		if e := cgroups.Remove(rel); e != nil {
			err = e
			continue
		}
		removed = append(removed, rel)
	}
	return removed, err
}

// RemoveTestLeftovers is for a test binary's TestMain, after m.Run: it removes the empty groups
// of terraform runs and plugins whose launchers the tests killed (a terraformer or kloud killed
// mid-run leaves its runs' groups, which the next one to start removes only a minute on). A
// group made in the last 2 s may be another test binary's whose launcher has not joined it yet:
// it waits those 2 s once if there is one. A no-op unless root.
func RemoveTestLeftovers() {
	if os.Geteuid() != 0 {
		return
	}
	const young = 2 * time.Second
	for _, prefix := range []string{CgroupPrefixTerraform, CgroupPrefixPlugin} {
		for _, rel := range cgroups.Orphans(prefix) {
			if len(cgroups.PIDs(rel)) == 0 && cgroups.Age(rel) < young {
				time.Sleep(young)
				break
			}
		}
		RemoveLeftoversOlder(prefix, young)
	}
}
