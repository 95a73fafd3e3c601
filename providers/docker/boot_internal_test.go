package docker

import (
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/userdata"
)

// TestBootScript checks the machine's PID 1 script without a daemon: bash parses it, the stages
// program it hands to python3 is userdata.CloudInitStages (but for the blank lines around it) (read from its here
// document by bash itself), and it falls back to the four commands on userdata's exit code. The
// boot itself is TestMachinesThroughTerraform's (cloud-init's output in the container's log).
func TestBootScript(t *testing.T) {
	bash := testutil.RequireBinary(t, "bash")
	if out, err := exec.Command(bash, "-n", "-c", bootScript).CombinedOutput(); err != nil {
		t.Fatalf("bash -n: %v\n%s", err, out)
	}
	if stagesUnavailable != strconv.Itoa(userdata.StagesUnavailable) {
		t.Fatalf("the boot script falls back on exit %s, userdata.StagesUnavailable is %d", stagesUnavailable, userdata.StagesUnavailable)
	}
	start := strings.Index(bootScript, "IFS= read")
	end := strings.Index(bootScript, "\nKLOUD_STAGES_PY\n")
	if start < 0 || end < 0 {
		t.Fatal("no stages here document in the boot script")
	}
	read := bootScript[start:end+len("\nKLOUD_STAGES_PY\n")] + `printf '%s' "$stages"`
	out, err := exec.Command(bash, "-c", read).Output()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.TrimSpace(string(out)), strings.TrimSpace(userdata.CloudInitStages); got != want {
		t.Errorf("the boot script hands python3:\n%s\nwant userdata.CloudInitStages:\n%s", got, want)
	}
}
