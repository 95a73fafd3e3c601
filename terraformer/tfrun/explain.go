package tfrun

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
)

// Diagnostics Terraform gives in its own terms that the engine can say in the template's.

// undeclaredRe finds the provider Terraform looked for under the default namespace: a
// configuration that uses a provider's resources without a required_providers entry for it.
var undeclaredRe = regexp.MustCompile(`provider registry\.terraform\.io/hashicorp/([a-z0-9_-]+) was not found`)

// explainDiagnostic rewrites d when the engine knows better what to do. A provider used without a
// required_providers entry is looked for as hashicorp/NAME; when the mirrors have NAME under
// another namespace (kloud/kloudlocal), the diagnostic names the block to add.
func (e *Engine) explainDiagnostic(d Diagnostic) Diagnostic {
	m := undeclaredRe.FindStringSubmatch(d.Summary + " " + d.Detail)
	if m == nil {
		return d
	}
	name := m[1]
	var sources []string
	for _, dir := range e.mirrors {
		found, _ := filepath.Glob(filepath.Join(dir, "registry.terraform.io", "*", name))
		for _, f := range found {
			if fi, err := os.Stat(f); err != nil || !fi.IsDir() {
				continue
			}
			if ns := filepath.Base(filepath.Dir(f)); ns != "hashicorp" && !slices.Contains(sources, ns+"/"+name) {
				sources = append(sources, ns+"/"+name)
			}
		}
	}
	if len(sources) != 1 {
		return d
	}
	d.Summary = fmt.Sprintf("provider %q is not declared", name)
	d.Detail = fmt.Sprintf("add terraform { required_providers { %s = { source = %q } } } to the template: without it Terraform looks for hashicorp/%s, which is not installed here (%s is)",
		name, sources[0], name, sources[0])
	return d
}
