package docker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"

	"github.com/kloud-dev/kloud/provider"
)

// The Docker API proxy's POST /containers/{id}/update (docker_container's in-place update of
// memory, memory_swap, memory_reservation, cpu_shares, cpu_set): allowed for a container of the
// token's stack whose machine the token lists (an apply's token, not yet expired), with only the
// resource-limit fields below set, the restart policy unchanged (the Docker provider sends the
// current one with every update; a change is refused: the policy decides whether the daemon
// restarts a machine behind kloud's back), and memory and cpus inside the provider's constraint
// vocabulary (constraints.go), as for a create. So an in-place change of a stack update keeps
// the container and its writable layer.

// updateFields are the container update request's fields (container.UpdateConfig) that may have
// a value other than their zero value. RestartPolicy is checked on its own.
var updateFields = []string{"Memory", "MemorySwap", "MemoryReservation", "NanoCpus", "CpuShares", "CpusetCpus"}

// updateAllowed checks a container update request for container id; it replaces r's body with
// the checked bytes.
func (d *Docker) updateAllowed(ctx context.Context, t *token, r *http.Request, id string) error {
	if t.expired() {
		return errors.New("container update: this stack's docker token has expired: build the stack again")
	}
	body, err := readBody(r, "update")
	if err != nil {
		return err
	}
	c, found, err := d.stackContainer(ctx, t, id) // service.go
	if err != nil {
		return err
	}
	if !found || c.HostConfig == nil {
		return &apiError{http.StatusNotFound, "no such container: " + id}
	}
	if !slices.Contains(t.Machines, c.Config.Labels[LabelMachine]) {
		return fmt.Errorf("container update: machine %q is not one this build may change (build the stack again)", c.Config.Labels[LabelMachine])
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return &apiError{http.StatusBadRequest, "container update: " + err.Error()}
	}
	var bad []string
	for k, v := range top {
		if k != "RestartPolicy" && !slices.Contains(updateFields, k) && !isZero(v) {
			bad = append(bad, k)
		}
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		return fmt.Errorf("container update: kloud's docker machines may change only their resource limits (%s) in place, not %s", strings.Join(updateFields, ", "), strings.Join(bad, ", "))
	}
	if raw := top["RestartPolicy"]; !isZero(raw) {
		var keys map[string]json.RawMessage
		if err := json.Unmarshal(raw, &keys); err != nil {
			return &apiError{http.StatusBadRequest, "container update: RestartPolicy: " + err.Error()}
		}
		for k := range keys {
			if k != "Name" && k != "MaximumRetryCount" {
				return fmt.Errorf("container update: RestartPolicy.%s is not a field kloud passes on", k)
			}
		}
		var rp struct {
			Name              string
			MaximumRetryCount int
		}
		if err := json.Unmarshal(raw, &rp); err != nil {
			return &apiError{http.StatusBadRequest, "container update: RestartPolicy: " + err.Error()}
		}
		cur := c.HostConfig.RestartPolicy
		same := func(a, b string) bool { return a == b || (a == "" || a == "no") && (b == "" || b == "no") }
		if rp.Name != "" && (!same(rp.Name, string(cur.Name)) || rp.MaximumRetryCount != cur.MaximumRetryCount) {
			return fmt.Errorf("container update: the restart policy of a kloud docker machine cannot change in place (%q, %d retries now; asked %q, %d): replace the machine to change it",
				cur.Name, cur.MaximumRetryCount, rp.Name, rp.MaximumRetryCount)
		}
	}
	var lim struct{ Memory, NanoCpus int64 }
	if err := json.Unmarshal(body, &lim); err != nil {
		return &apiError{http.StatusBadRequest, "container update: " + err.Error()}
	}
	if err := d.checkLimits(ctx, lim.Memory, lim.NanoCpus); err != nil {
		return &apiError{http.StatusBadRequest, "container update: " + err.Error()}
	}
	setBody(r, body)
	return nil
}

// checkLimits checks a container's memory (bytes) and NanoCpus, where set (non-zero), against
// the provider's constraint vocabulary, as the plan checked the template's memory and cpus.
func (d *Docker) checkLimits(ctx context.Context, memory, nanoCPUs int64) error {
	attrs := map[string]any{}
	if memory != 0 {
		attrs["memory"] = memory >> 20
	}
	if nanoCPUs != 0 {
		attrs["cpus"] = float64(nanoCPUs) / 1e9
	}
	if len(attrs) == 0 {
		return nil
	}
	return provider.ValidateConstraints(d.constraints(ctx), attrs)
}

// createLimits checks a container create request's HostConfig.Memory and NanoCpus (checkLimits).
func (d *Docker) createLimits(ctx context.Context, body []byte) error {
	var req struct {
		HostConfig struct{ Memory, NanoCpus int64 }
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return fmt.Errorf("container create: %w", err)
	}
	if err := d.checkLimits(ctx, req.HostConfig.Memory, req.HostConfig.NanoCpus); err != nil {
		return &apiError{http.StatusBadRequest, "container create: " + err.Error()}
	}
	return nil
}
