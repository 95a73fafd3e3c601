package kloud_test

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store/storetest"
)

// Several kloud replicas on one store (issue 24): real kloud servers on one `kloud store serve`
// (storetest.Serve, the server that executes its clients' commands one at a time), as a load
// balancer would send one user's requests to any of them.

// startReplicas starts n kloud servers on one store server, each with its own data directory
// holding the one secret key they share (as an operator copies it); the first one starts alone
// (it creates the signing keys and the admin), the others find them in the store.
func startReplicas(t *testing.T, n int) []*kloudtest.Env {
	t.Helper()
	url := storetest.Serve(t)
	out := make([]*kloudtest.Env, n)
	var secret []byte
	for i := range out {
		dir := t.TempDir()
		if i > 0 {
			if err := os.WriteFile(filepath.Join(dir, "secret.key"), secret, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		out[i] = kloudtest.Start(t, kloudtest.Options{MongoURL: url, DataDir: dir})
		if i == 0 {
			var err error
			if secret, err = os.ReadFile(filepath.Join(dir, "secret.key")); err != nil {
				t.Fatal(err)
			}
		}
	}
	return out
}

// TestReplicasShareLoginLimit: failed logins of one user and address count on every replica:
// five failures spread over two replicas, then both refuse even the right password (429), and
// another user is not affected. With the counts in memory (before issue 24) each replica let
// five through.
func TestReplicasShareLoginLimit(t *testing.T) {
	t.Parallel()
	rs := startReplicas(t, 2)
	for _, u := range []string{"bob", "carol"} {
		if _, err := rs[0].Client(kloud.Admin).UserAdd(t.Context(), api.UserAddParams{Username: u, Team: model.DefaultTeam, Password: u + "'s long password"}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 5 {
		if code, body := login(t, rs[i%2].URL, "bob", fmt.Sprintf("guess %d", i), ""); code != http.StatusUnauthorized {
			t.Fatalf("failure %d on replica %d: %d %v", i+1, i%2, code, body)
		}
	}
	for i, r := range rs {
		code, body, resp := loginResp(t, r.URL, "bob", "bob's long password", "")
		if code != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("replica %d after 5 failures over both: %d %v", i, code, body)
		}
	}
	if code, body := login(t, rs[1].URL, "carol", "carol's long password", ""); code != http.StatusOK {
		t.Fatalf("another user: %d %v", code, body)
	}
}

// TestReplicasEnforceRevocation: a session logged out on replica A is refused by replica B, and
// the kite connection B holds with it is closed, within B's reload of the revocations (5 s; the
// time is logged, and bounded here by 30 s for a loaded machine). A session that is not revoked
// keeps its connection on B.
func TestReplicasEnforceRevocation(t *testing.T) {
	t.Parallel()
	rs := startReplicas(t, 2)
	a, b := rs[0], rs[1]
	if _, err := a.Client(kloud.Admin).UserAdd(t.Context(), api.UserAddParams{Username: "alice", Team: model.DefaultTeam, Password: "correct horse battery"}); err != nil {
		t.Fatal(err)
	}
	session := func() string {
		code, body := login(t, a.URL, "alice", "correct horse battery", "")
		if code != http.StatusOK {
			t.Fatalf("login: %d %v", code, body)
		}
		return body["session"].(string)
	}
	revoked, kept := session(), session()
	onB, err := dialSession(t, b, revoked)
	if err != nil {
		t.Fatalf("session of A on B: %v", err)
	}
	keptOnB, err := dialSession(t, b, kept)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, a.URL+"/api/logout", nil)
	req.Header.Set("Authorization", "Bearer "+revoked)
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("logout on A: %d", resp.StatusCode)
	}
	select {
	case <-onB.Done():
		t.Logf("replica B closed the connection of the session logged out on A after %v (bound: 5 s)", time.Since(start).Round(time.Millisecond))
	case <-time.After(30 * time.Second):
		t.Fatal("replica B still holds the connection of a session logged out on A 30 s later")
	}
	if _, err := dialSession(t, b, revoked); err == nil {
		t.Fatal("replica B accepted a session logged out on A")
	}
	var who map[string]any
	if err := keptOnB.Call(t.Context(), "user.whoami", nil, &who); err != nil {
		t.Fatalf("the other session on B: %v", err)
	}
}
