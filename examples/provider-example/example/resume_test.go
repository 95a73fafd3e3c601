package example_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/provider"
)

// TestPluginRestart: the plugin is SIGKILLed (kloud's launcher restarts it) and its machines'
// processes die with it, as kloud's sandbox wants. The restarted plugin powers on again the
// machine that was on (its agent connects again, kloud shows it Running and connected) and
// leaves the one its user stopped off (issue 23: chaos plugin-apply found machines Running
// with a dead agent, and builds waiting minutes for an agent that died with the plugin).
func TestPluginRestart(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	ctx := t.Context()
	cred, err := e.alice.CredentialAdd(ctx, api.CredentialAddParams{Provider: "example", Title: "mine", Data: json.RawMessage(`{"label":"red"}`)})
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.alice.CredentialBootstrap(ctx, api.CredentialBootstrapParams{CredentialID: cred.ID})
	e.succeed(api.JobRef{JobID: b.JobID}, err)
	_, sid := e.build("two", twoMachines)
	ms := e.machines(sid)
	e.succeed(e.alice.MachineStop(ctx, api.MachineRef{MachineID: ms["vm.1"].ID}))
	vm0 := filepath.Join(e.dir, "machines", sid, "vm.0")
	before := len(machineProcs(vm0))

	bin := filepath.Join(e.pluginDir, "kloud-provider-example")
	old := pluginPID(bin)
	if old == 0 || before == 0 {
		t.Fatalf("plugin pid %d, vm.0's supervisor %d: want both running", old, before)
	}
	syscall.Kill(old, syscall.SIGKILL)
	start := time.Now()
	// Its old processes die with the plugin and kloud sees the agent go (not asserted: the
	// restarted plugin may be quicker than a poll).
	testutil.Eventually(t, 90*time.Second, func() bool {
		m := e.machines(sid)["vm.0"]
		if m.Agent.Status != model.AgentConnected || !m.Agent.LastSeen.After(start) || len(machineProcs(vm0)) == 0 {
			return false
		}
		info, err := e.alice.MachineInfo(ctx, api.MachineRef{MachineID: m.ID})
		return err == nil && info.InfraState == provider.Running
	}, "vm.0 not Running with its agent connected again after the plugin restarted")
	t.Logf("vm.0 Running with a connected agent %s after the plugin's kill", time.Since(start).Round(time.Millisecond))
	if pid := pluginPID(bin); pid == 0 || pid == old {
		t.Fatalf("plugin pid %d after the restart (was %d)", pid, old)
	}
	info, err := e.alice.MachineInfo(ctx, api.MachineRef{MachineID: ms["vm.1"].ID})
	if err != nil || info.InfraState != provider.Stopped {
		t.Fatalf("vm.1, stopped before the restart: %+v %v; want it left Stopped", info, err)
	}
	e.succeed(e.alice.StackApply(ctx, api.StackApplyParams{StackID: sid, Destroy: true}))
}

// pluginPID returns the pid of the process running the plugin binary bin, 0 if none.
func pluginPID(bin string) int {
	entries, _ := os.ReadDir("/proc")
	for _, en := range entries {
		pid, err := strconv.Atoi(en.Name())
		if err != nil {
			continue
		}
		cmdline, _ := os.ReadFile("/proc/" + en.Name() + "/cmdline")
		if arg0, _, _ := strings.Cut(string(cmdline), "\x00"); arg0 == bin {
			return pid
		}
	}
	return 0
}
