package docker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/moby/moby/client"
)

// Following the daemon (Watch): a container the daemon starts on its own (its restart policy,
// or the daemon restarted) gets a new bridge port that the firewall's table does not know, and
// the table drops new connections to it from every machine (it fails closed) until it is
// rebuilt. Watch follows the daemon's event stream (GET /events) filtered to this kloud
// instance's containers and rebuilds the table when one starts, dies or goes, so such a machine
// is reachable by the machines allowed to reach it again within moments. Events that come
// together (a build starting ten machines, a die followed by its restart) are one rebuild.
// When the stream breaks (the daemon restarted, a connection cut), Watch opens it again, with
// backoff while the daemon does not answer, and rebuilds once it is open again: what happened
// while it was away is not lost.

// Watch timing: the pause after an event before the rebuild, and the backoff between attempts
// to open the event stream (and to rebuild after a failed rebuild).
const (
	watchSettle     = 100 * time.Millisecond
	watchMinBackoff = 250 * time.Millisecond
	watchMaxBackoff = 30 * time.Second
)

// watchActions are the container events that change what the firewall's table holds: a new
// bridge port (start, restart), a port gone (die), a machine gone with its rules (destroy).
var watchActions = []string{"start", "restart", "die", "destroy"}

// Watch follows the daemon's container events for the firewall until ctx ends (see above). It
// returns at once when the provider has no firewall. kloud serve runs it for its lifetime.
func (d *Docker) Watch(ctx context.Context) {
	if d.fw == nil {
		return
	}
	backoff := watchMinBackoff
	for {
		opened, err := d.watchOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if opened {
			// It worked: a fresh break, said once (a daemon that does not answer is said by
			// Available, not every 30 s here).
			backoff = watchMinBackoff
			d.log.Warn("docker provider: the daemon's event stream broke; the firewall follows it again when it answers", "err", err)
		} else {
			d.log.Debug("docker provider: the daemon's event stream", "retry", backoff, "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, watchMaxBackoff)
	}
}

// watchOnce follows one event stream until it breaks or ctx ends; opened says whether the daemon
// answered on it (an event came, or the rebuild it asked for worked).
func (d *Docker) watchOnce(ctx context.Context) (opened bool, err error) {
	cli, err := d.Client()
	if err != nil {
		return false, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	res := cli.Events(ctx, client.EventsListOptions{Filters: make(client.Filters).
		Add("type", "container").
		Add("event", watchActions...).
		Add("label", LabelInstance+"="+d.instance)})
	// What happened while no stream was open (kloud starting, the daemon restarting) is caught
	// up by one rebuild now that the stream is open.
	dirty, retry := true, watchMinBackoff
	var settle <-chan time.Time
	for {
		if dirty && settle == nil {
			settle = time.After(watchSettle)
		}
		select {
		case <-ctx.Done():
			return opened, ctx.Err()
		case err := <-res.Err:
			if err == nil {
				err = errors.New("the daemon closed it")
			}
			return opened, fmt.Errorf("the daemon's event stream: %w", err)
		case m := <-res.Messages:
			opened = true
			if m.Actor.Attributes[LabelInstance] == d.instance {
				dirty = true
				if m.Action == "start" || m.Action == "restart" {
					d.limitsAfterStart(ctx, m.Actor.ID) // limits.go: a start behind kloud's back
				}
			}
		case <-settle:
			settle = nil
			if err := d.ApplyFirewall(ctx); err != nil {
				if ctx.Err() != nil {
					return opened, ctx.Err()
				}
				d.log.Warn("docker provider: firewall after a container event", "retry", retry, "err", err)
				settle = time.After(retry) // dirty stays: try again
				retry = min(2*retry, watchMaxBackoff)
				continue
			}
			dirty, retry, opened = false, watchMinBackoff, true
		}
	}
}
