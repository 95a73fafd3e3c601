package docker

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strconv"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/client"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/provider"
)

// machine is one container as kloud controls it, outside Terraform.
type machine struct {
	d   *Docker
	cli *client.Client
	id  string // the container id: the docker_container's "id" attribute
	b   *provider.BaseMachine
}

func (d *Docker) machine(b *provider.BaseMachine) (provider.Machine, error) {
	cli, err := d.Client()
	if err != nil {
		return nil, err
	}
	id, _ := b.Attributes["id"].(string)
	if id == "" {
		return nil, fmt.Errorf("docker machine %s: no container id in its Terraform state: %w", b.Label, kite.ErrState)
	}
	return &machine{d: d, cli: cli, id: id, b: b}, nil
}

func (m *machine) wrap(op string, err error) error {
	if cerrdefs.IsNotFound(err) {
		return fmt.Errorf("%s docker machine %s (%.12s): %w: %w", op, m.b.Label, m.id, err, kite.ErrNotFound)
	}
	return fmt.Errorf("%s docker machine %s (%.12s): %w", op, m.b.Label, m.id, err)
}

// inspect returns the container, checked to be this kloud instance's machine m.
func (m *machine) inspect(ctx context.Context) (client.ContainerInspectResult, error) {
	res, err := m.cli.ContainerInspect(ctx, m.id, client.ContainerInspectOptions{})
	if err != nil {
		return res, err
	}
	c := res.Container
	if c.Config == nil || c.Config.Labels[LabelInstance] != m.d.instance || (m.b.ID != "" && c.Config.Labels[LabelMachine] != m.b.ID) {
		return res, fmt.Errorf("container %.12s is not kloud machine %s of this kloud: %w", m.id, m.b.Label, kite.ErrNotFound)
	}
	return res, nil
}

// meta is what kloud stores as the machine's metadata: the container id and its address.
func (m *machine) meta(res client.ContainerInspectResult) map[string]any {
	out := map[string]any{"container_id": res.Container.ID}
	if ns := res.Container.NetworkSettings; ns != nil {
		if ep := ns.Networks[m.d.opts.Network]; ep != nil && ep.IPAddress.IsValid() {
			out["ip_address"] = ep.IPAddress.String()
		}
	}
	return out
}

// Start starts the container again on its writable layer (its boot script runs cloud-init
// again, whose per-boot modules restart the agent).
func (m *machine) Start(ctx context.Context) (any, error) {
	if _, err := m.inspect(ctx); err != nil {
		return nil, m.wrap("start", err)
	}
	if _, err := m.cli.ContainerStart(ctx, m.id, client.ContainerStartOptions{}); err != nil {
		return nil, m.wrap("start", err)
	}
	if err := m.d.firewallAfterStart(ctx, m.id); err != nil { // firewall.go
		return nil, m.wrap("start", err)
	}
	m.d.limitsAfterStart(ctx, m.id) // limits.go
	res, err := m.inspect(ctx)
	if err != nil {
		return nil, m.wrap("start", err)
	}
	return m.meta(res), nil
}

// Stop stops the container (SIGTERM, then SIGKILL after 10 s) and keeps its writable layer.
func (m *machine) Stop(ctx context.Context) (any, error) {
	if _, err := m.inspect(ctx); err != nil {
		return nil, m.wrap("stop", err)
	}
	timeout := 10
	if _, err := m.cli.ContainerStop(ctx, m.id, client.ContainerStopOptions{Timeout: &timeout}); err != nil {
		return nil, m.wrap("stop", err)
	}
	return map[string]any{"container_id": m.id}, nil
}

// Info reports running → Running, created or exited → Stopped, absent → Terminated.
func (m *machine) Info(ctx context.Context) (provider.State, any, error) {
	res, err := m.inspect(ctx)
	if cerrdefs.IsNotFound(err) {
		return provider.Terminated, nil, nil
	}
	if err != nil {
		return provider.Unknown, nil, m.wrap("inspect", err)
	}
	st := res.Container.State
	switch {
	case st == nil:
		return provider.Unknown, nil, m.wrap("inspect", fmt.Errorf("no state"))
	case st.Running || st.Restarting:
		m.d.firewallAfterInfo(ctx, st.StartedAt) // firewall.go
		return provider.Running, m.meta(res), nil
	case st.Status == "removing" || st.Dead:
		return provider.Terminated, nil, nil
	}
	return provider.Stopped, m.meta(res), nil
}

// ConsoleMax bounds what ConsoleLog returns (the end of the log).
const ConsoleMax = 64 << 10

// ConsoleLog implements provider.ConsoleLogger: the end of the container's output (docker
// logs): the boot script's lines and everything the cloud-init stages print, the user data's
// scripts included. It is read from the daemon, so it works while the machine is stopped or its
// agent never came up.
func (m *machine) ConsoleLog(ctx context.Context) (string, error) {
	if _, err := m.inspect(ctx); err != nil {
		return "", m.wrap("read console of", err)
	}
	rc, err := m.cli.ContainerLogs(ctx, m.id, client.ContainerLogsOptions{ShowStdout: true, ShowStderr: true, Tail: strconv.Itoa(2000)})
	if err != nil {
		return "", m.wrap("read console of", err)
	}
	defer rc.Close()
	var buf bytes.Buffer
	if _, err := stdcopy.StdCopy(&buf, &buf, io.LimitReader(rc, 16<<20)); err != nil {
		return "", m.wrap("read console of", err)
	}
	b := buf.Bytes()
	if len(b) > ConsoleMax {
		b = b[len(b)-ConsoleMax:]
	}
	return string(b), nil
}

var (
	_ provider.Machine       = (*machine)(nil)
	_ provider.ConsoleLogger = (*machine)(nil)
)
