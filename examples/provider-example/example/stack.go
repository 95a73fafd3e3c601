package example

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/provider/plugin"
	"github.com/kloud-dev/kloud/userdata"
)

// stack is what the provider does for one stack request (provider.Stack). kloud builds a new
// one per request from a BaseStack: the stack, its template, its machines, and how to get each
// machine's agent configuration.
type stack struct {
	e *example
	b *provider.BaseStack
}

// credential returns the decoded credential: kloud decoded it into *Credential (Schema), so a
// type assertion is all it takes.
func credential(c *provider.Credential) (*Credential, error) {
	if c == nil {
		return nil, errors.New("example: this needs a credential of provider example")
	}
	cr, ok := c.Value.(*Credential)
	if !ok {
		return nil, fmt.Errorf("example: credential of type %T, want *example.Credential", c.Value)
	}
	return cr, nil
}

// VerifyCredential checks that the credential works against the infrastructure
// (`kloud credential authenticate`). Valid() has checked the values on their own already;
// here the provider asks "the cloud": this host must be usable and allow that many machines.
// The error is the reason the user sees.
func (s *stack) VerifyCredential(ctx context.Context, c *provider.Credential) error {
	cr, err := credential(c)
	if err != nil {
		return err
	}
	if err := s.e.available(); err != nil {
		return err
	}
	if cr.MaxMachines > s.e.o.Capacity {
		return fmt.Errorf("maxMachines %d is more than this host allows (%d): ask for fewer", cr.MaxMachines, s.e.o.Capacity)
	}
	return nil
}

// BootstrapTemplates returns what kloud applies once per credential and team before stacks use
// it (`kloud credential bootstrap`): shared resources, here the team's "network", a
// terraform_data record. Terraform keeps its state, so bootstrapping again changes nothing and
// outputs the same id; the outputs decode into Bootstrap.
func (s *stack) BootstrapTemplates(ctx context.Context, c *provider.Credential) ([]*provider.Template, error) {
	cr, err := credential(c)
	if err != nil {
		return nil, err
	}
	main := fmt.Sprintf(`resource "terraform_data" "network" {
  input = { label = %q, team = %q }
}

output "networkId" {
  value = "%s-net-${terraform_data.network.id}"
}
`, cr.Label, c.Team, cr.Label)
	return []*provider.Template{{Files: map[string][]byte{"network.tf": []byte(main)}}}, nil
}

// Names of what ApplyTemplate generates (resource names starting with kloud_ are kloud's own:
// they are never taken for machines).
const (
	generatedFile = "kloud_example.tf.json"
	tokenVar      = "kloud_example_token"
	labelsVar     = "kloud_example_labels_" // + resource: machine labels in count order
	lifeResource  = "kloud_life_"           // + resource: destroys its machine when destroyed
	bootResource  = "kloud_boot_"           // + resource: boots its machine when created
)

// The provisioners' commands. The token travels in a header file (bash process substitution),
// not on curl's command line; the script on stdin; the boot names the machine resource's id in
// Terraform's state (RESOURCE), which the machine's record keeps for kloud's garbage collector.
// --fail-with-body makes curl fail with the service's reason, which Terraform then shows.
// --retry asks again after a transient answer (503: the plugin died during the request and kloud
// is starting it again; the chaos suite's plugin-apply found a build failing on that): boot and
// destroy are idempotent, and curl keeps the script it read from stdin for the next attempt.
const (
	curlRetry      = `--retry 5 --retry-delay 2`
	bootCommand    = `printf '%s' "$SCRIPT" | curl --fail-with-body -sS -m 120 ` + curlRetry + ` -H @<(echo "Authorization: Bearer $TOKEN") --data-binary @- "$URL/boot?resource=$RESOURCE"`
	destroyCommand = `curl --fail-with-body -sS -m 120 ` + curlRetry + ` -X POST -H @<(echo "Authorization: Bearer $TOKEN") "$URL/destroy"`
)

// localExec is a resource's local-exec provisioner running command with bash, at destroy if when
// is "destroy".
func localExec(when, command string, env map[string]any) []any {
	pe := map[string]any{"command": command, "interpreter": []string{"/bin/bash", "-c"}, "environment": env}
	if when != "" {
		pe["when"] = when
	}
	return []any{map[string]any{"local-exec": pe}}
}

// destroyProvisioner is kloud_life_'s: it destroys the machine named by the resource's own
// input (all a destroy-time provisioner may read is self).
func destroyProvisioner() []any {
	return localExec("destroy", destroyCommand, map[string]any{"URL": "${self.input.url}", "TOKEN": "${self.input.token}"})
}

// ApplyTemplate rewrites the stack's template before kloud applies it: it checks the stack
// against the credential, gives every machine its provisioning script (BaseStack.InjectUserData
// puts it into the machine resource's `input`) and adds the resources that boot and destroy
// the machines through the provider's HTTP service.
func (s *stack) ApplyTemplate(ctx context.Context, c *provider.Credential) (*provider.Template, error) {
	cr, err := credential(c)
	if err != nil {
		return nil, err
	}
	if n := len(s.b.Machines); n > cr.MaxMachines {
		return nil, fmt.Errorf("example: the stack has %d machines, credential %q allows %d (maxMachines)", n, c.Title, cr.MaxMachines)
	}
	if !plugin.ValidName(s.b.StackID) {
		return nil, fmt.Errorf("example: stack id %q is not a directory name", s.b.StackID)
	}
	network := "" // the team's network, if the credential was bootstrapped
	if b, ok := c.Bootstrap.(*Bootstrap); ok {
		network = b.NetworkID
	}
	if err := os.MkdirAll(filepath.Join(s.e.o.Dir, "machines"), 0o700); err != nil {
		return nil, fmt.Errorf("example: %w", err)
	}

	labels := map[string][]string{} // machine resource → its machines' labels, count order
	counted := map[string]bool{}
	machines := map[string]bootSpec{}
	var kloudURL string
	err = s.b.InjectUserData(ctx, func(m *provider.MachineSpec, cfg userdata.Config) ([]byte, error) {
		if !plugin.ValidName(m.Label) {
			return nil, fmt.Errorf("machine label %q is not a directory name", m.Label)
		}
		// The provider's host reaches kloud where klient is downloaded from, which is also
		// where the provider's HTTP service is.
		u, ok := strings.CutSuffix(cfg.KlientURL, "/dl/klient")
		if !ok {
			return nil, fmt.Errorf("klient URL %q is not kloud's /dl/klient", cfg.KlientURL)
		}
		kloudURL = u
		cfg.Hostname = cr.Label + "-" + cfg.Hostname
		script, err := userdata.RenderScript(cfg, s.e.dir(s.b.StackID, m.Label))
		if err != nil {
			return nil, err
		}
		labels[m.Resource] = append(labels[m.Resource], m.Label)
		counted[m.Resource] = m.Index != nil
		machines[m.Label] = bootSpec{Script: plugin.ScriptSum(script), Owner: cfg.Username, Hostname: cfg.Hostname, Network: network, Machine: m.ID}
		return script, nil
	})
	if err != nil {
		return nil, fmt.Errorf("example: %w", err)
	}
	gone, err := s.goneResources(labels)
	if err != nil {
		return nil, err
	}
	res := map[string]any{}
	for _, name := range gone {
		// A machine resource the template no longer declares (a stack update removed its
		// block) that still has machines (records): its kloud_life_ block stays, with no
		// instances, so that Terraform runs their destroy-time provisioners (it runs them only
		// while the block exists). The next build after they are gone drops it.
		res[lifeResource+name] = map[string]any{"count": 0, "provisioner": destroyProvisioner()}
	}
	if len(machines) == 0 && len(res) == 0 {
		return s.b.Template, nil
	}
	out := map[string]any{"resource": map[string]any{"terraform_data": res}}
	if len(machines) > 0 {
		token, err := s.e.mint(claims{Stack: s.b.StackID, Team: s.b.Team, Machines: machines, Exp: time.Now().Add(s.e.o.TokenTTL).Unix()})
		if err != nil {
			return nil, err
		}
		out["variable"] = s.machineResources(res, labels, counted, kloudURL, token)
	}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return nil, err
	}
	s.b.Template.Files[generatedFile] = b
	return s.b.Template, nil
}

// machineResources adds to res, per machine resource NAME of labels (count or not),
// kloud_life_NAME and kloud_boot_NAME, sets the variables they read (the token, the machines'
// labels) and returns their declarations. Both are replaced whenever the machine is (its id) or
// its script changes (every build renders new agent keys, so building again boots the machines
// again). Two resources because Terraform runs no destroy-time provisioner of a resource left
// tainted by a failed create-time one: kloud_life_ has no create-time provisioner, so its
// destroy always runs.
func (s *stack) machineResources(res map[string]any, labels map[string][]string, counted map[string]bool, kloudURL, token string) map[string]any {
	vars := map[string]any{tokenVar: map[string]any{"type": "string", "sensitive": true}}
	s.b.Template.Variables[tokenVar] = token
	for _, name := range slices.Sorted(maps.Keys(labels)) {
		lv := labelsVar + name
		vars[lv] = map[string]any{"type": "list(string)"}
		s.b.Template.Variables[lv] = labels[name]
		inst, life, idx := "terraform_data."+name, "terraform_data."+lifeResource+name, "0"
		if counted[name] {
			inst, life, idx = inst+"[count.index]", life+"[count.index]", "count.index"
		}
		triggers := []string{"${" + inst + ".id}", "${sha256(" + inst + ".output)}"}
		lifeRes := map[string]any{
			"triggers_replace": triggers,
			// All a destroy-time provisioner may read is self: the URL and the token live here.
			"input": map[string]any{
				"url":   kloudURL + provider.HandlerPrefix(s.b.Provider.Name) + "v1/machines/" + s.b.StackID + "/${var." + lv + "[" + idx + "]}",
				"token": "${var." + tokenVar + "}",
			},
			"provisioner": destroyProvisioner(),
		}
		bootRes := map[string]any{
			"triggers_replace": triggers,
			"input":            "${" + life + ".output}", // so it is created after kloud_life_
			"provisioner": localExec("", bootCommand, map[string]any{
				"URL": "${self.input.url}", "TOKEN": "${self.input.token}", "SCRIPT": "${" + inst + ".output}", "RESOURCE": "${" + inst + ".id}"}),
		}
		if counted[name] {
			lifeRes["count"] = len(labels[name])
			bootRes["count"] = len(labels[name])
		}
		res[lifeResource+name] = lifeRes
		res[bootResource+name] = bootRes
	}
	return vars
}

// goneResources are the machine resources with machines in this stack (their records,
// resources.go: written before a machine's disk, removed after it) that labels (resource → the
// labels rendered now) does not have: a stack update removed their block.
func (s *stack) goneResources(labels map[string][]string) ([]string, error) {
	recs, err := s.e.records(s.b.StackID)
	if err != nil {
		return nil, fmt.Errorf("example: machine records: %w", err)
	}
	have := make([]string, 0, len(recs))
	for _, p := range recs {
		have = append(have, p.label)
	}
	return provider.RemovedResources(have, labels), nil
}
