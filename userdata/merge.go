package userdata

import (
	"errors"
	"fmt"
	"path"
	"reflect"
	"sort"
	"strconv"
	"strings"
)

// ErrMerge is wrapped by every merge conflict; errors.As with *MergeError gives the details.
var ErrMerge = errors.New("cloud-config merge conflict")

// MergeError is a merge conflict at one key path, e.g. `users[name=alice].sudo` or
// `write_files[path=/etc/motd]`.
type MergeError struct {
	Path    string // where, in cloud-config terms
	Base    any    // kloud's (or the earlier) value; nil when not relevant
	Overlay any    // the value that could not be merged
	Reason  string // what is wrong
}

func (e *MergeError) Error() string {
	return fmt.Sprintf("merge %s: %s: base %s, overlay %s", e.Path, e.Reason, show(e.Base), show(e.Overlay))
}

// Unwrap makes errors.Is(err, ErrMerge) true.
func (e *MergeError) Unwrap() error { return ErrMerge }

// show formats a value for an error message: strings quoted, compound values by shape.
func show(v any) string {
	switch v := v.(type) {
	case nil:
		return "null"
	case string:
		return strconv.Quote(v)
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		return "map{" + strings.Join(keys, ",") + "}"
	case []any:
		return fmt.Sprintf("list(%d items)", len(v))
	default:
		return fmt.Sprint(v)
	}
}

// Merge returns base with overlay merged in; neither input is modified. Rules:
//   - maps merge key by key, recursively;
//   - lists concatenate (base first), except that an overlay item that is a map with a "name"
//     equal to that of an earlier map item is merged into it (e.g. groups added to a user);
//   - in write_files, two entries with the same path (after path.Clean) conflict;
//   - equal scalars are fine; different scalars, or different kinds (map, list, scalar), conflict;
//   - a null value on either side counts as absent.
//
// Conflicts are *MergeError values wrapping ErrMerge. Values may be any Go maps with string keys,
// slices and scalars; the result holds only map[string]any, []any and scalars (integers as int,
// floats as float64).
func Merge(base, overlay map[string]any) (map[string]any, error) {
	b, err := normalize(base, "")
	if err != nil {
		return nil, err
	}
	o, err := normalize(overlay, "")
	if err != nil {
		return nil, err
	}
	bm, _ := b.(map[string]any)
	om, _ := o.(map[string]any)
	if bm == nil {
		bm = map[string]any{}
	}
	return mergeMaps(bm, om, "")
}

// mergeMaps merges o into b (both already normalized copies, so b may be changed).
func mergeMaps(b, o map[string]any, at string) (map[string]any, error) {
	keys := make([]string, 0, len(o))
	for k := range o {
		keys = append(keys, k)
	}
	sort.Strings(keys) // report the first conflict deterministically
	for _, k := range keys {
		v, err := mergeValues(b[k], o[k], join(at, k))
		if err != nil {
			return nil, err
		}
		if v != nil {
			b[k] = v
		}
	}
	return b, nil
}

func mergeValues(b, o any, at string) (any, error) {
	if o == nil {
		return b, nil
	}
	if b == nil {
		// Still apply the list and map rules within the overlay itself.
		switch ov := o.(type) {
		case map[string]any:
			return mergeMaps(map[string]any{}, ov, at)
		case []any:
			return mergeLists(nil, ov, at)
		}
		return o, nil
	}
	switch bv := b.(type) {
	case map[string]any:
		ov, ok := o.(map[string]any)
		if !ok {
			return nil, &MergeError{Path: at, Base: b, Overlay: o, Reason: "cannot merge " + kind(o) + " into a map"}
		}
		return mergeMaps(bv, ov, at)
	case []any:
		ov, ok := o.([]any)
		if !ok {
			return nil, &MergeError{Path: at, Base: b, Overlay: o, Reason: "cannot merge " + kind(o) + " into a list"}
		}
		return mergeLists(bv, ov, at)
	default:
		if kind(o) != "scalar" {
			return nil, &MergeError{Path: at, Base: b, Overlay: o, Reason: "cannot merge " + kind(o) + " into a scalar"}
		}
		if !reflect.DeepEqual(b, o) {
			return nil, &MergeError{Path: at, Base: b, Overlay: o, Reason: "conflicting values"}
		}
		return b, nil
	}
}

func mergeLists(b, o []any, at string) (any, error) {
	isFiles := at == "write_files"
	out := b
	for _, item := range o {
		m, ok := item.(map[string]any)
		if !ok {
			out = append(out, item)
			continue
		}
		if isFiles {
			if p, ok := m["path"].(string); ok {
				if j := findKey(out, "path", p); j >= 0 {
					return nil, &MergeError{Path: fmt.Sprintf("write_files[path=%s]", p), Base: out[j], Overlay: item, Reason: "two entries write the same path"}
				}
			}
			out = append(out, item)
			continue
		}
		name, ok := m["name"]
		if !ok || kind(name) != "scalar" || name == nil {
			out = append(out, item)
			continue
		}
		j := findKey(out, "name", name)
		if j < 0 {
			out = append(out, item)
			continue
		}
		merged, err := mergeMaps(out[j].(map[string]any), m, fmt.Sprintf("%s[name=%v]", at, name))
		if err != nil {
			return nil, err
		}
		out[j] = merged
	}
	return out, nil
}

// findKey returns the index of the first map in list whose key equals want (paths compared
// after path.Clean), or -1.
func findKey(list []any, key string, want any) int {
	for i, item := range list {
		m, ok := item.(map[string]any)
		if !ok {
			continue
		}
		got, ok := m[key]
		if !ok {
			continue
		}
		if key == "path" {
			gs, ok1 := got.(string)
			ws, ok2 := want.(string)
			if ok1 && ok2 && path.Clean(gs) == path.Clean(ws) {
				return i
			}
			continue
		}
		if reflect.DeepEqual(got, want) {
			return i
		}
	}
	return -1
}

func kind(v any) string {
	switch v.(type) {
	case map[string]any:
		return "map"
	case []any:
		return "list"
	default:
		return "scalar"
	}
}

func join(at, k string) string {
	if at == "" {
		return k
	}
	return at + "." + k
}

// normalize deep-copies v into map[string]any, []any and plain scalars (ints as int, floats as
// float64), rejecting what YAML cannot say (non-string map keys, funcs, channels, ...).
func normalize(v any, at string) (any, error) {
	if v == nil {
		return nil, nil
	}
	rv := reflect.ValueOf(v)
	for rv.Kind() == reflect.Pointer || rv.Kind() == reflect.Interface {
		if rv.IsNil() {
			return nil, nil
		}
		rv = rv.Elem()
	}
	where := at
	if where == "" {
		where = "top level"
	}
	switch rv.Kind() {
	case reflect.Map:
		if rv.IsNil() {
			return nil, nil
		}
		out := make(map[string]any, rv.Len())
		it := rv.MapRange()
		for it.Next() {
			k := it.Key()
			for k.Kind() == reflect.Interface && !k.IsNil() {
				k = k.Elem()
			}
			if k.Kind() != reflect.String {
				return nil, fmt.Errorf("%s: map key %v is not a string: %w", where, k, ErrInvalid)
			}
			n, err := normalize(it.Value().Interface(), join(at, k.String()))
			if err != nil {
				return nil, err
			}
			out[k.String()] = n
		}
		return out, nil
	case reflect.Slice, reflect.Array:
		if rv.Kind() == reflect.Slice && rv.IsNil() {
			return nil, nil
		}
		if rv.Type().Elem().Kind() == reflect.Uint8 {
			return nil, fmt.Errorf("%s: byte slices are not cloud-config values (use a string): %w", where, ErrInvalid)
		}
		out := make([]any, rv.Len())
		for i := range out {
			n, err := normalize(rv.Index(i).Interface(), fmt.Sprintf("%s[%d]", at, i))
			if err != nil {
				return nil, err
			}
			out[i] = n
		}
		return out, nil
	case reflect.String:
		return rv.String(), nil
	case reflect.Bool:
		return rv.Bool(), nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return int(rv.Int()), nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return int(rv.Uint()), nil
	case reflect.Float32, reflect.Float64:
		return rv.Float(), nil
	default:
		return nil, fmt.Errorf("%s: a %s is not a cloud-config value: %w", where, rv.Type(), ErrInvalid)
	}
}
