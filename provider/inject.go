package provider

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/kloud-dev/kloud/userdata"
)

// UserDataVar is the name of the generated variable that carries the user data of a resource's
// machines.
func UserDataVar(resource string) string { return "kloud_user_data_" + resource }

// InjectUserData gives every machine of this provider its agent: for each machine resource it
// takes the user data the template author wrote (the attribute's literal value, else the planned
// value), renders the machine's user data with render (e.g. userdata.Render for cloud-init) and rewrites
// the attribute to a generated, sensitive variable holding one rendered user data per count index.
// It updates b.Template's files and variables.
func (b *BaseStack) InjectUserData(ctx context.Context, render func(m *MachineSpec, c userdata.Config) ([]byte, error)) error {
	if b.Provider.UserDataAttr == "" {
		return fmt.Errorf("provider %s has no user data attribute", b.Provider.Name)
	}
	cfg, err := b.Template.Parsed()
	if err != nil {
		return err
	}
	byRes := map[string][]*MachineSpec{}
	for _, m := range b.Machines {
		byRes[m.Resource] = append(byRes[m.Resource], m)
	}
	names := make([]string, 0, len(byRes))
	for n := range byRes {
		names = append(names, n)
	}
	sort.Strings(names)
	if b.Template.Variables == nil {
		b.Template.Variables = map[string]any{}
	}
	typ, attr := b.Provider.ResourceType, b.Provider.UserDataAttr
	for _, res := range names {
		ms := byRes[res]
		sort.Slice(ms, func(i, j int) bool { return idx(ms[i]) < idx(ms[j]) })
		script, ok, err := cfg.LiteralString(typ, res, attr)
		if err != nil {
			return fmt.Errorf("%s.%s: %w", typ, res, err)
		}
		rendered := make([]string, len(ms))
		for i, m := range ms {
			if m.Index != nil && *m.Index != i {
				return fmt.Errorf("%s.%s: machines must have count indexes 0..%d, got %d", typ, res, len(ms)-1, *m.Index)
			}
			userScript := script
			if !ok {
				userScript = plannedString(m.Attributes, attr)
			}
			ac, err := b.AgentConfig(ctx, m)
			if err != nil {
				return fmt.Errorf("machine %s: %w", m.Label, err)
			}
			ac.UserData = userScript
			if ac.Hostname == "" {
				ac.Hostname = Hostname(m.Label)
			}
			out, err := render(m, ac)
			if err != nil {
				return fmt.Errorf("machine %s: user data: %w", m.Label, err)
			}
			rendered[i] = string(out)
		}
		v := UserDataVar(res)
		if ms[0].Index != nil {
			if err := cfg.DeclareVariable(v, "list(string)", true); err != nil {
				return err
			}
			b.Template.Variables[v] = rendered
		} else {
			if len(ms) != 1 {
				return fmt.Errorf("%s.%s: %d machines without count", typ, res, len(ms))
			}
			if err := cfg.DeclareVariable(v, "string", true); err != nil {
				return err
			}
			b.Template.Variables[v] = rendered[0]
		}
		if err := cfg.SetUserData(typ, res, attr, v); err != nil {
			return err
		}
	}
	b.Template.Files = cfg.Files()
	return nil
}

func idx(m *MachineSpec) int {
	if m.Index == nil {
		return -1
	}
	return *m.Index
}

// plannedString reads attribute path attr ("user_data" or "input.user_data") from planned values.
func plannedString(attrs map[string]any, attr string) string {
	var cur any = attrs
	for _, p := range strings.Split(attr, ".") {
		m, ok := cur.(map[string]any)
		if !ok {
			return ""
		}
		cur = m[p]
	}
	s, _ := cur.(string)
	return s
}

// Hostname turns a machine label ("web.0") into a host name ("web-0").
func Hostname(label string) string {
	h := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-':
			return r
		case r >= 'A' && r <= 'Z':
			return r + 'a' - 'A'
		}
		return '-'
	}, label)
	h = strings.Trim(h, "-")
	if len(h) > 63 {
		h = h[:63]
	}
	if h == "" {
		h = "machine"
	}
	return h
}
