package sandbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"testing"

	"github.com/kloud-dev/kloud/providers/local/sandbox"
)

// envCreator makes the test binary act as a short-lived creator process (like the terraform
// provider): it creates one machine and exits. The value is a JSON creatorJob.
const envCreator = "KLOUD_SANDBOX_TEST_CREATOR"

type creatorJob struct {
	StateDir, BaseImage, Bridge string
	Subnet                      netip.Prefix
	Spec                        sandbox.Spec
}

func TestMain(m *testing.M) {
	sandbox.MaybeRunInit()
	if job := os.Getenv(envCreator); job != "" {
		os.Exit(runCreator(job))
	}
	if job := os.Getenv(envDiskJob); job != "" { // snapshot_test.go
		os.Exit(runDiskJob(job))
	}
	os.Exit(m.Run())
}

func runCreator(job string) int {
	var j creatorJob
	if err := json.Unmarshal([]byte(job), &j); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	m, err := sandbox.New(sandbox.Options{StateDir: j.StateDir, BaseImage: j.BaseImage, Bridge: j.Bridge, Subnet: j.Subnet})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	info, err := m.Create(context.Background(), j.Spec)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	json.NewEncoder(os.Stdout).Encode(info)
	return 0
}
