package kloud

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/stackbuild"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/provider/tmpl"
)

// Bucket claims (docs/buckets.md "Claims"): a template's kloud_bucket blocks are kloud's, not
// Terraform's. The template build (stacks.go build) reads and checks them, resolves each one's
// provider and takes them out of the files Terraform sees; the build flow provisions them
// (stackbuild/buckets.go) before the machines and the destroy ends them after.

// templateBuckets reads cfg's kloud_bucket blocks, resolves the provider of each (its
// provider argument, else the one provider of the template's machines, machineProviders,
// that provisions buckets) and removes them from cfg. Problems are invalid params naming the
// file and line.
func templateBuckets(reg *provider.Registry, cfg *tmpl.Config, machineProviders []string) ([]stackbuild.BucketSpec, error) {
	decls, err := cfg.Buckets()
	if err != nil {
		return nil, fmt.Errorf("template: %s: %w", err.Error(), kite.ErrInvalidParams)
	}
	if len(decls) == 0 {
		return nil, nil
	}
	var capable []string
	for _, name := range machineProviders {
		if p, err := reg.Lookup(name); err == nil && p.Buckets != nil {
			capable = append(capable, name)
		}
	}
	slices.Sort(capable)
	var out []stackbuild.BucketSpec
	for _, d := range decls {
		s := stackbuild.BucketSpec{Label: d.Label, Provider: d.Provider, Retain: d.Retain, MaxBytes: d.MaxSizeMB << 20}
		where := fmt.Sprintf("template: %s:%d: resource %q %q", d.File, d.Line, tmpl.BucketType, d.Label)
		switch {
		case s.Provider != "":
			p, err := reg.Lookup(s.Provider)
			if err != nil || p.Buckets == nil {
				return nil, fmt.Errorf("%s: provider %q provisions no buckets (%s): %w", where, s.Provider, bucketProviders(reg), kite.ErrInvalidParams)
			}
		case len(capable) == 1:
			s.Provider = capable[0]
		default:
			why := "none of the stack's machine providers provisions buckets"
			if len(capable) > 1 {
				why = "several of the stack's machine providers provision buckets (" + strings.Join(capable, ", ") + ")"
			}
			return nil, fmt.Errorf("%s: %s: say which with provider = \"NAME\" (%s): %w", where, why, bucketProviders(reg), kite.ErrInvalidParams)
		}
		out = append(out, s)
	}
	if err := cfg.RemoveBuckets(); err != nil {
		return nil, fmt.Errorf("template: %w", err)
	}
	return out, nil
}

// bucketProviders says which providers provision buckets.
func bucketProviders(reg *provider.Registry) string {
	var out []string
	for _, name := range reg.Names() {
		if p, _ := reg.Lookup(name); p.Buckets != nil {
			out = append(out, name)
		}
	}
	if len(out) == 0 {
		return "no provider of this kloud provisions buckets"
	}
	return "providers that do: " + strings.Join(out, ", ")
}
