// Package vagranttest starts, for a test, a real vagrant host: a private dockerd (package
// providers/docker/dockertest) with the Debian base image imported as Image, and a klient --vagrant registered
// with the given kontrol under the given kite key, driving the real vagrant with its docker
// provider. Everything stops when the test ends, and a container left behind fails the test.
package vagranttest

import (
	"context"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/klient"
	"github.com/kloud-dev/kloud/kontrol/kontrolapi"
	"github.com/kloud-dev/kloud/providers/docker/dockertest"
)

// Image is the Docker image of the base image in the host's dockerd.
const Image = "kloud-vagrant-test:1"

// Host is a running vagrant host.
type Host struct {
	Dockerd *dockertest.Daemon
	KiteID  string
	Home    string // the klient's vagrant home
}

// Start starts a host whose klient uses keyFile (a kite key of its owner) and kontrolURL. It
// skips the test (fails under CI=true) without vagrant, dockerd, root or the base image.
func Start(t *testing.T, kontrolURL, keyFile string) *Host {
	t.Helper()
	testutil.RequireBinary(t, "vagrant")
	d := dockertest.New(t)
	d.Import(t, Image)
	h := &Host{Dockerd: d, Home: t.TempDir()}
	ready := make(chan kontrolapi.RegisterResult, 1)
	kl, err := klient.New(klient.Options{
		KiteKeyFile: keyFile, KontrolURL: kontrolURL, StateDir: t.TempDir(), Logger: testutil.Logger(t),
		Vagrant: &klient.VagrantOptions{Home: h.Home, Env: []string{d.Env()}},
		Ready: func(r kontrolapi.RegisterResult) {
			select {
			case ready <- r:
			default:
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); kl.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case r := <-ready:
		h.KiteID = r.Kite.Kite.ID
	case <-time.After(30 * time.Second):
		t.Fatal("klient --vagrant did not register")
	}
	t.Cleanup(func() {
		for _, c := range d.Containers(t) {
			t.Errorf("container %s left behind", c)
			d.Docker(t, "rm", "-f", c)
		}
	})
	return h
}
