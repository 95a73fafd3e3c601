package docker_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/providers/docker"
	"github.com/kloud-dev/kloud/providers/docker/dockertest"
)

// TestFirewallFollowsRestarts: with Watch running, a machine the daemon starts again on its own
// (a restart behind kloud's back through the Docker API; its init killed, restarted by its
// restart policy) is reachable again by its owner's other machine within moments, and still not
// by another user's, though its bridge port is new; when the event stream breaks (the daemon's
// socket cut and refusing) a restart meanwhile leaves the machine unreachable (the table fails
// closed), and once the daemon answers again Watch follows it again and catches up.
func TestFirewallFollowsRestarts(t *testing.T) {
	t.Parallel()
	var sp *sockProxy
	f := newFixtureWith(t, "fw2", func(o *docker.Options, dd *dockertest.Daemon) {
		sp = newSockProxy(t, strings.TrimPrefix(dd.Host, "unix://"))
		o.Host = sp.host
	})
	if why := f.d.FirewallUnusable(); why != "" {
		testutil.Unavailable(t, "the docker firewall cannot work here: %s", why)
	}
	ctx := t.Context()
	cli := f.dd.Client // the daemon itself, not through sp: behind kloud's back
	pc, image := f.stackProxy(t, []string{"alice", "alice", "bob"})

	wctx, stop := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { f.d.Watch(wctx); close(stopped) }()
	t.Cleanup(func() {
		stop()
		select {
		case <-stopped:
		case <-time.After(10 * time.Second):
			t.Error("Watch did not return after its context ended")
		}
	})

	ids := map[string]string{}
	owners := map[string]string{"m0": "alice", "m1": "alice", "m2": "bob"}
	for _, m := range []string{"m0", "m1", "m2"} {
		cfg := &container.Config{Image: image, Entrypoint: []string{"sleep", "infinity"}, StopSignal: "SIGKILL",
			Labels: map[string]string{docker.LabelStack: "s1", docker.LabelMachine: m, docker.LabelInstance: "fw2",
				docker.LabelOwner: owners[m], docker.LabelTeam: "red"}}
		hc := &container.HostConfig{NetworkMode: container.NetworkMode(f.d.Network())}
		if m == "m0" {
			// Its web server is its init: it comes back with every restart.
			cfg.Entrypoint = []string{"sh", "-c", "mkdir -p /srv && echo from-m0 > /srv/index.html && cd /srv && exec python3 -m http.server 8080"}
			hc.RestartPolicy = container.RestartPolicy{Name: container.RestartPolicyAlways}
		}
		c, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{Name: "kloud-fw2-" + m, Config: cfg, HostConfig: hc})
		if err != nil {
			t.Fatal(err)
		}
		ids[m] = c.ID
		if _, err := pc.ContainerStart(ctx, c.ID, client.ContainerStartOptions{}); err != nil {
			t.Fatalf("start %s through the proxy: %v", m, err)
		}
	}
	inspect := func(m string) container.InspectResponse {
		t.Helper()
		res, err := cli.ContainerInspect(ctx, ids[m], client.ContainerInspectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return res.Container
	}
	url := func() string {
		return "http://" + inspect("m0").NetworkSettings.Networks[f.d.Network()].IPAddress.String() + ":8080/index.html"
	}
	reach := func(from string) bool {
		ctx, cancel := context.WithTimeout(ctx, readyWait)
		defer cancel()
		out, err := f.dd.CLI(ctx, "exec", ids[from], "curl", "-s", "--noproxy", "*", "-m", "1", url())
		return err == nil && strings.TrimSpace(out) == "from-m0"
	}
	// The host (kloud) always reaches it: its server is up.
	serving := func() bool {
		hc := &http.Client{Timeout: 2 * time.Second}
		res, err := hc.Get(url())
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK
	}
	followed := func(when string) {
		t.Helper()
		testutil.Eventually(t, readyWait, func() bool { return reach("m1") }, "%s: the owner's other machine cannot reach m0", when)
		if reach("m2") {
			t.Errorf("%s: another user's machine reaches m0", when)
		}
	}
	followed("at first")

	// Restarted behind kloud's back through the Docker API.
	before := inspect("m0").State.StartedAt
	if _, err := cli.ContainerRestart(ctx, ids["m0"], client.ContainerRestartOptions{}); err != nil {
		t.Fatal(err)
	}
	if inspect("m0").State.StartedAt == before {
		t.Fatal("m0 was not restarted")
	}
	followed("after a restart through the Docker API")

	// Its init killed: the daemon restarts it (restart policy).
	st := inspect("m0").State
	if err := syscall.Kill(st.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, readyWait, func() bool {
		s := inspect("m0").State
		return s.Running && s.StartedAt != st.StartedAt
	}, "the daemon did not restart m0 after its init was killed")
	followed("after the daemon restarted it (restart policy)")

	// The stream cut: a restart meanwhile is not followed (fails closed) until the daemon
	// answers again.
	sp.setDown(true)
	before = inspect("m0").State.StartedAt
	if _, err := cli.ContainerRestart(ctx, ids["m0"], client.ContainerRestartOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, readyWait, serving, "m0's server is not up after its restart")
	if inspect("m0").State.StartedAt == before {
		t.Fatal("m0 was not restarted")
	}
	if reach("m1") {
		t.Error("while kloud cannot hear the daemon, a restarted machine's new port is reachable: the table does not fail closed")
	}
	sp.setDown(false)
	followed("after the event stream came back")
}

// sockProxy forwards a unix socket to the daemon's; setDown cuts every connection and refuses
// new ones until it is set up again.
type sockProxy struct {
	host   string // unix://<its socket>
	target string
	mu     sync.Mutex
	down   bool
	conns  map[net.Conn]bool
}

func newSockProxy(t *testing.T, target string) *sockProxy {
	path := filepath.Join(t.TempDir(), "d.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	p := &sockProxy{host: "unix://" + path, target: target, conns: map[net.Conn]bool{}}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		p.setDown(true)
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() { defer wg.Done(); p.serve(c) }()
		}
	}()
	return p
}

func (p *sockProxy) serve(c net.Conn) {
	defer c.Close()
	p.mu.Lock()
	if p.down {
		p.mu.Unlock()
		return
	}
	up, err := net.Dial("unix", p.target)
	if err != nil {
		p.mu.Unlock()
		return
	}
	defer up.Close()
	p.conns[c], p.conns[up] = true, true
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { io.Copy(up, c); done <- struct{}{} }()
	go func() { io.Copy(c, up); done <- struct{}{} }()
	<-done
	c.Close()
	up.Close()
	<-done
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, up)
	p.mu.Unlock()
}

func (p *sockProxy) setDown(down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = down
	if down {
		for c := range p.conns {
			c.Close()
		}
	}
}
