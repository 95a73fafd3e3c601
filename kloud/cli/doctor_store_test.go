package cli_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/kloud-dev/kloud/kloud/cli"
	"github.com/kloud-dev/kloud/kloud/store/storetest"
)

// kloud doctor --mongo-url runs the store race against that store without a kloud: it passes
// against kloud store serve and fails (exit 1, with the counts) against a plain FerretDB v1
// reached by several connections, which loses updates.
func TestDoctorStoreRace(t *testing.T) {
	doctor := func(url string) (int, map[string]any, string) {
		var out, errOut bytes.Buffer
		code := cli.Run(t.Context(), []string{"doctor", "--json", "--mongo-url", url, "--race-rounds", "60"}, &out, &errOut)
		var res map[string]any
		if err := json.Unmarshal(out.Bytes(), &res); err != nil {
			t.Fatalf("doctor --json: %v\n%s\n%s", err, out.String(), errOut.String())
		}
		return code, res, out.String()
	}
	code, res, out := doctor(storetest.Serve(t))
	t.Logf("kloud store serve: %s", out)
	if code != 0 || res["ok"] != true {
		t.Errorf("against kloud store serve: exit %d, %s", code, out)
	}
	code, res, out = doctor(storetest.NewServer(t).URL)
	t.Logf("plain FerretDB: %s", out)
	if code != 1 || res["ok"] != false {
		t.Errorf("against a plain FerretDB: exit %d, %s; want 1 with violations", code, out)
	}
}
