package tfrun

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// Reading the state without `terraform show`: after every apply and destroy the engine needs the
// state as `terraform show -json` prints it (state.json, Result). show starts every provider of
// the state to get its schema: for the Docker provider (76 MB) that is a second start after the
// apply's, ~1-3 s on a loaded host (bench/RESULTS.md). The state file (terraform.tfstate, format
// version 4, local backend) already holds everything show prints: every attribute's value (the
// provider wrote the object whole, nulls included), the sensitive paths (Terraform 1.10+ records
// the schema's sensitive attributes there too, not only values from sensitive variables), the
// outputs with their types and sensitivity, the instances' index keys, tainted status, deposed
// keys and dependencies. readStateFile converts it to show's JSON (format 1.0); the engine falls
// back to show when it cannot (another state version, a file that is not the sandbox user's
// regular file). TestStateFileMatchesShow compares both on real states.
//
// The file is written by the sandboxed terraform, so it is untrusted: it is opened without
// following a symlink, must be a regular file owned by the sandbox user (a hard link to another
// user's file is not), and is read up to maxStateFile bytes.

// maxStateFile bounds the state file terraformer reads itself (show reads larger ones).
const maxStateFile = 64 << 20

// errStateFile says the state file cannot be read directly; the caller runs show instead.
var errStateFile = errors.New("state file not read directly")

type stateFileV4 struct {
	Version          int                        `json:"version"`
	TerraformVersion string                     `json:"terraform_version"`
	Outputs          map[string]stateFileOutput `json:"outputs"`
	Resources        []stateFileResource        `json:"resources"`
	CheckResults     json.RawMessage            `json:"check_results"`
}

type stateFileOutput struct {
	Value     json.RawMessage `json:"value"`
	Type      json.RawMessage `json:"type"`
	Sensitive bool            `json:"sensitive"`
}

type stateFileResource struct {
	Module    string              `json:"module"`
	Mode      string              `json:"mode"`
	Type      string              `json:"type"`
	Name      string              `json:"name"`
	Provider  string              `json:"provider"`
	Instances []stateFileInstance `json:"instances"`
}

type stateFileInstance struct {
	IndexKey            json.RawMessage   `json:"index_key"`
	Status              string            `json:"status"`
	Deposed             string            `json:"deposed"`
	SchemaVersion       uint64            `json:"schema_version"`
	Attributes          json.RawMessage   `json:"attributes"`
	AttributesFlat      json.RawMessage   `json:"attributes_flat"`
	SensitiveAttributes []json.RawMessage `json:"sensitive_attributes"`
	Dependencies        []string          `json:"dependencies"`
}

// showState is `terraform show -json` of a state (terraform's internal/command/jsonstate).
type showState struct {
	FormatVersion    string      `json:"format_version"`
	TerraformVersion string      `json:"terraform_version,omitempty"`
	Values           *showValues `json:"values,omitempty"`
}

type showValues struct {
	Outputs    map[string]showOutput `json:"outputs,omitempty"`
	RootModule showModule            `json:"root_module"`
}

type showOutput struct {
	Sensitive bool            `json:"sensitive"`
	Value     json.RawMessage `json:"value,omitempty"`
	Type      json.RawMessage `json:"type,omitempty"`
}

type showModule struct {
	Resources    []showResource `json:"resources,omitempty"`
	Address      string         `json:"address,omitempty"`
	ChildModules []*showModule  `json:"child_modules,omitempty"`
}

type showResource struct {
	Address         string          `json:"address"`
	Mode            string          `json:"mode"`
	Type            string          `json:"type"`
	Name            string          `json:"name"`
	Index           json.RawMessage `json:"index,omitempty"`
	ProviderName    string          `json:"provider_name"`
	SchemaVersion   uint64          `json:"schema_version"`
	Values          json.RawMessage `json:"values,omitempty"`
	SensitiveValues json.RawMessage `json:"sensitive_values,omitempty"`
	DependsOn       []string        `json:"depends_on,omitempty"`
	Tainted         bool            `json:"tainted,omitempty"`
	DeposedKey      string          `json:"deposed_key,omitempty"`
}

// readStateFile reads work's terraform.tfstate and returns it as `terraform show -json` prints
// it (not decoded: run.state decodes it, refreshState only stores it). uid >= 0 is the owner the
// file must have. An error wrapping errStateFile means: use show.
func readStateFile(path string, uid int) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errStateFile, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errStateFile, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: %s is not a regular file", errStateFile, path)
	}
	if sys, ok := fi.Sys().(*syscall.Stat_t); uid >= 0 && (!ok || int(sys.Uid) != uid) {
		return nil, fmt.Errorf("%w: %s is not the sandbox user's", errStateFile, path)
	}
	if fi.Size() > maxStateFile {
		return nil, fmt.Errorf("%w: %s is larger than %d bytes", errStateFile, path, maxStateFile)
	}
	src, err := io.ReadAll(io.LimitReader(f, maxStateFile+1))
	if err != nil || len(src) > maxStateFile {
		return nil, fmt.Errorf("%w: read %s: %v", errStateFile, path, err)
	}
	raw, err := convertStateFile(src)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", errStateFile, path, err)
	}
	return raw, nil
}

// convertStateFile turns a version 4 state into show's JSON.
func convertStateFile(src []byte) ([]byte, error) {
	var sf stateFileV4
	dec := json.NewDecoder(bytes.NewReader(src))
	if err := dec.Decode(&sf); err != nil {
		return nil, err
	}
	if sf.Version != 4 {
		return nil, fmt.Errorf("state format version %d (only 4 is read directly)", sf.Version)
	}
	if len(sf.CheckResults) > 0 && !isJSONNull(sf.CheckResults) {
		return nil, errors.New("check results (show prints them from the configuration's checks)")
	}
	out := showState{FormatVersion: "1.0", TerraformVersion: sf.TerraformVersion, Values: &showValues{}}
	if len(sf.Outputs) > 0 {
		out.Values.Outputs = map[string]showOutput{}
		for name, o := range sf.Outputs {
			out.Values.Outputs[name] = showOutput{Sensitive: o.Sensitive, Value: o.Value, Type: o.Type}
		}
	}
	modules := map[string]*showModule{"": &out.Values.RootModule}
	var module func(addr string) *showModule
	module = func(addr string) *showModule {
		if m := modules[addr]; m != nil {
			return m
		}
		m := &showModule{Address: addr}
		modules[addr] = m
		parent := module(parentModule(addr))
		parent.ChildModules = append(parent.ChildModules, m)
		return m
	}
	for _, r := range sf.Resources {
		if r.Mode != "managed" && r.Mode != "data" {
			return nil, fmt.Errorf("resource %s.%s: mode %q", r.Type, r.Name, r.Mode)
		}
		providerName, err := providerSource(r.Provider)
		if err != nil {
			return nil, fmt.Errorf("resource %s.%s: %w", r.Type, r.Name, err)
		}
		m := module(r.Module)
		base := r.Type + "." + r.Name
		if r.Mode == "data" {
			base = "data." + base
		}
		if r.Module != "" {
			base = r.Module + "." + base
		}
		for _, in := range r.Instances {
			if len(in.AttributesFlat) > 0 && !isJSONNull(in.AttributesFlat) {
				return nil, fmt.Errorf("resource %s: flatmap attributes (a state of Terraform 0.11)", base)
			}
			addr, err := instanceAddress(base, in.IndexKey)
			if err != nil {
				return nil, err
			}
			attrs, err := plainAttributes(providerName, r.Type, in.Attributes)
			if err != nil {
				return nil, fmt.Errorf("resource %s: %w", addr, err)
			}
			in.Attributes = attrs
			sens, err := sensitiveValues(in.Attributes, in.SensitiveAttributes)
			if err != nil {
				return nil, fmt.Errorf("resource %s: %w", addr, err)
			}
			sr := showResource{Address: addr, Mode: r.Mode, Type: r.Type, Name: r.Name, ProviderName: providerName,
				SchemaVersion: in.SchemaVersion, Values: in.Attributes, SensitiveValues: sens, DependsOn: in.Dependencies,
				Tainted: in.Status == "tainted", DeposedKey: in.Deposed}
			if len(in.IndexKey) > 0 && !isJSONNull(in.IndexKey) {
				sr.Index = in.IndexKey
			}
			m.Resources = append(m.Resources, sr)
		}
	}
	if len(sf.Resources) == 0 && len(sf.Outputs) == 0 {
		out.Values = nil // show prints an empty state so
	}
	for _, m := range modules {
		sort.SliceStable(m.Resources, func(i, j int) bool { return m.Resources[i].Address < m.Resources[j].Address })
		sort.SliceStable(m.ChildModules, func(i, j int) bool { return m.ChildModules[i].Address < m.ChildModules[j].Address })
	}
	return json.Marshal(out)
}

// dynamicAttrs are the attributes of dynamic type of the resource types whose schema is
// Terraform's own (provider name → type → attributes). A dynamic value is stored with its type,
// {"value": V, "type": T}; show prints V.
var dynamicAttrs = map[string]map[string][]string{
	"terraform.io/builtin/terraform": {"terraform_data": {"input", "output", "triggers_replace"}},
}

// plainAttributes returns an instance's attributes as show prints them: the known dynamic
// attributes unwrapped; an error (show knows the schema) when another value looks like a
// dynamic one.
func plainAttributes(providerName, typ string, attrs json.RawMessage) (json.RawMessage, error) {
	dyn := dynamicAttrs[providerName][typ]
	if len(attrs) == 0 || isJSONNull(attrs) {
		return attrs, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(attrs, &m); err != nil {
		return nil, fmt.Errorf("attributes: %w", err)
	}
	changed := false
	for k, v := range m {
		if slices.Contains(dyn, k) {
			if w, ok := dynamicValue(v); ok {
				m[k], changed = w, true
			}
			continue
		}
		if looksDynamic(v) {
			return nil, fmt.Errorf("attribute %s may be of dynamic type (stored with its type): only the provider's schema tells", k)
		}
	}
	if !changed {
		return attrs, nil
	}
	return json.Marshal(m)
}

// dynamicValue returns V of {"value": V, "type": T}.
func dynamicValue(raw json.RawMessage) (json.RawMessage, bool) {
	var w map[string]json.RawMessage
	if json.Unmarshal(raw, &w) != nil || len(w) != 2 || w["type"] == nil || w["value"] == nil {
		return nil, false
	}
	return w["value"], true
}

// looksDynamic reports whether raw holds, at any depth, an object of exactly the keys value and
// type, the form of a dynamic value.
func looksDynamic(raw json.RawMessage) bool {
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return false
	}
	var walk func(v any) bool
	walk = func(v any) bool {
		switch v := v.(type) {
		case map[string]any:
			if _, ok := v["type"]; ok && len(v) == 2 {
				if _, ok := v["value"]; ok {
					return true
				}
			}
			for _, e := range v {
				if walk(e) {
					return true
				}
			}
		case []any:
			for _, e := range v {
				if walk(e) {
					return true
				}
			}
		}
		return false
	}
	return walk(v)
}

// parentModule is "module.a[0]" for "module.a[0].module.b", "" for "module.a".
func parentModule(addr string) string {
	// Module instance keys are numbers or quoted strings; a quoted key may hold ".module.".
	depth, inQuote, last := 0, false, -1
	for i := 0; i < len(addr); i++ {
		switch c := addr[i]; {
		case inQuote && c == '\\':
			i++
		case c == '"':
			inQuote = !inQuote
		case inQuote:
		case c == '[':
			depth++
		case c == ']':
			depth--
		case c == '.' && depth == 0 && strings.HasPrefix(addr[i:], ".module."):
			last = i
		}
	}
	if last < 0 {
		return ""
	}
	return addr[:last]
}

// providerSource turns a state's provider config address (provider["registry.terraform.io/
// hashicorp/local"], optionally .alias and with a module prefix) into show's provider_name.
func providerSource(cfg string) (string, error) {
	i := strings.Index(cfg, `provider["`)
	if i < 0 {
		return "", fmt.Errorf("provider address %q", cfg)
	}
	rest := cfg[i+len(`provider[`):]
	end := strings.Index(rest, `"]`)
	if end < 0 {
		return "", fmt.Errorf("provider address %q", cfg)
	}
	s, err := strconv.Unquote(rest[:end+1])
	if err != nil {
		return "", fmt.Errorf("provider address %q: %w", cfg, err)
	}
	return s, nil
}

// instanceAddress appends an instance's index key: [0] or ["key"].
func instanceAddress(base string, key json.RawMessage) (string, error) {
	if len(key) == 0 || isJSONNull(key) {
		return base, nil
	}
	var v any
	if err := json.Unmarshal(key, &v); err != nil {
		return "", fmt.Errorf("resource %s: index key: %w", base, err)
	}
	switch v := v.(type) {
	case float64:
		return base + "[" + strconv.FormatFloat(v, 'f', -1, 64) + "]", nil
	case string:
		b, _ := json.Marshal(v) // Terraform quotes keys as HCL strings; for these JSON agrees
		return base + "[" + string(b) + "]", nil
	}
	return "", fmt.Errorf("resource %s: index key %s", base, key)
}

func isJSONNull(raw json.RawMessage) bool { return strings.TrimSpace(string(raw)) == "null" }

// A step of a sensitive path: {"type":"get_attr","value":"name"} or {"type":"index",
// "value":{"value":KEY,"type":TYPE}}.
type pathStep struct {
	Type  string          `json:"type"`
	Value json.RawMessage `json:"value"`
}

// sensitiveValues builds show's sensitive_values for attributes: the value's shape, with true
// where a path is sensitive, objects and maps keeping only the keys with something sensitive
// below, lists and sets one entry per element (false when not sensitive). As show does
// (terraform's jsonstate.SensitiveAsBool).
func sensitiveValues(attrs json.RawMessage, paths []json.RawMessage) (json.RawMessage, error) {
	var v any
	if len(attrs) > 0 {
		d := json.NewDecoder(bytes.NewReader(attrs))
		d.UseNumber()
		if err := d.Decode(&v); err != nil {
			return nil, fmt.Errorf("attributes: %w", err)
		}
	}
	marks := &markTree{}
	for _, p := range paths {
		var steps []pathStep
		if err := json.Unmarshal(p, &steps); err != nil {
			return nil, fmt.Errorf("sensitive_attributes: %w", err)
		}
		n := marks
		for _, s := range steps {
			var key string
			switch s.Type {
			case "get_attr":
				if err := json.Unmarshal(s.Value, &key); err != nil {
					return nil, fmt.Errorf("sensitive_attributes: %w", err)
				}
			case "index":
				var idx struct {
					Value json.RawMessage `json:"value"`
				}
				if err := json.Unmarshal(s.Value, &idx); err != nil {
					return nil, fmt.Errorf("sensitive_attributes: %w", err)
				}
				var k any
				if err := json.Unmarshal(idx.Value, &k); err != nil {
					return nil, fmt.Errorf("sensitive_attributes: %w", err)
				}
				switch k := k.(type) {
				case string:
					key = k
				case float64:
					key = strconv.FormatFloat(k, 'f', -1, 64)
				default:
					return nil, fmt.Errorf("sensitive_attributes: index %s", idx.Value)
				}
			default:
				return nil, fmt.Errorf("sensitive_attributes: step %q", s.Type)
			}
			n = n.child(key)
		}
		n.marked = true
	}
	b, err := json.Marshal(asBool(v, marks))
	if err != nil {
		return nil, err
	}
	return b, nil
}

type markTree struct {
	marked bool
	kids   map[string]*markTree
}

func (m *markTree) child(k string) *markTree {
	if m.kids == nil {
		m.kids = map[string]*markTree{}
	}
	if m.kids[k] == nil {
		m.kids[k] = &markTree{}
	}
	return m.kids[k]
}

func (m *markTree) get(k string) *markTree {
	if m == nil {
		return nil
	}
	return m.kids[k]
}

// asBool is SensitiveAsBool over a JSON value: true when marked; a list's elements each; an
// object's keys with something sensitive below; false for the rest.
func asBool(v any, m *markTree) any {
	if m != nil && m.marked {
		return true
	}
	switch v := v.(type) {
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = asBool(e, m.get(strconv.Itoa(i)))
		}
		return out
	case map[string]any:
		out := map[string]any{}
		for k, e := range v {
			if b := asBool(e, m.get(k)); b != false {
				out[k] = b
			}
		}
		return out
	}
	return false
}
