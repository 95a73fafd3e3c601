package userdata

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestMerge(t *testing.T) {
	owner := func() map[string]any {
		return map[string]any{"name": "alice", "sudo": "ALL=(ALL) NOPASSWD:ALL", "shell": "/bin/bash"}
	}
	tests := []struct {
		name          string
		base, overlay map[string]any
		want          map[string]any
	}{
		{"empty overlay", map[string]any{"a": 1}, nil, map[string]any{"a": 1}},
		{"nil base", nil, map[string]any{"a": 1}, map[string]any{"a": 1}},
		{"new keys", map[string]any{"a": 1}, map[string]any{"b": "x"}, map[string]any{"a": 1, "b": "x"}},
		{"equal scalars", map[string]any{"a": "x"}, map[string]any{"a": "x"}, map[string]any{"a": "x"}},
		{"nested maps", map[string]any{"apt": map[string]any{"a": 1, "m": map[string]any{"x": true}}},
			map[string]any{"apt": map[string]any{"b": 2, "m": map[string]any{"y": false}}},
			map[string]any{"apt": map[string]any{"a": 1, "b": 2, "m": map[string]any{"x": true, "y": false}}}},
		{"lists concatenate in order", map[string]any{"runcmd": []any{[]any{"/p.sh"}}},
			map[string]any{"runcmd": []any{"echo a", []any{"touch", "b"}}},
			map[string]any{"runcmd": []any{[]any{"/p.sh"}, "echo a", []any{"touch", "b"}}}},
		{"same name merges", map[string]any{"users": []any{owner()}},
			map[string]any{"users": []any{map[string]any{"name": "alice", "groups": []any{"docker"}}, "default"}},
			map[string]any{"users": []any{
				map[string]any{"name": "alice", "sudo": "ALL=(ALL) NOPASSWD:ALL", "shell": "/bin/bash", "groups": []any{"docker"}},
				"default",
			}}},
		{"same name, lists inside concatenate", map[string]any{"users": []any{map[string]any{"name": "a", "groups": []any{"x"}}}},
			map[string]any{"users": []any{map[string]any{"name": "a", "groups": []any{"y"}}}},
			map[string]any{"users": []any{map[string]any{"name": "a", "groups": []any{"x", "y"}}}}},
		{"different names append", map[string]any{"users": []any{owner()}},
			map[string]any{"users": []any{map[string]any{"name": "bob"}}},
			map[string]any{"users": []any{owner(), map[string]any{"name": "bob"}}}},
		{"two overlay items of one name merge too", map[string]any{"users": []any{}},
			map[string]any{"users": []any{map[string]any{"name": "b", "shell": "/bin/sh"}, map[string]any{"name": "b", "gecos": "B"}}},
			map[string]any{"users": []any{map[string]any{"name": "b", "shell": "/bin/sh", "gecos": "B"}}}},
		{"write_files different paths", map[string]any{"write_files": []any{map[string]any{"path": "/a"}}},
			map[string]any{"write_files": []any{map[string]any{"path": "/b"}}},
			map[string]any{"write_files": []any{map[string]any{"path": "/a"}, map[string]any{"path": "/b"}}}},
		{"write_files items are not merged by name", map[string]any{"write_files": []any{map[string]any{"path": "/a", "name": "n"}}},
			map[string]any{"write_files": []any{map[string]any{"path": "/b", "name": "n"}}},
			map[string]any{"write_files": []any{map[string]any{"path": "/a", "name": "n"}, map[string]any{"path": "/b", "name": "n"}}}},
		{"null overlay is absent", map[string]any{"a": "x"}, map[string]any{"a": nil}, map[string]any{"a": "x"}},
		{"null base is absent", map[string]any{"a": nil}, map[string]any{"a": []any{1}}, map[string]any{"a": []any{1}}},
		{"typed Go values normalise", map[string]any{"packages": []string{"a"}, "n": int64(3)},
			map[string]any{"packages": []string{"b"}, "n": 3, "m": map[string]string{"k": "v"}},
			map[string]any{"packages": []any{"a", "b"}, "n": 3, "m": map[string]any{"k": "v"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Merge(tc.base, tc.overlay)
			if err != nil {
				t.Fatalf("Merge: %v", err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Merge =\n%#v\nwant\n%#v", got, tc.want)
			}
		})
	}
}

func TestMergeConflicts(t *testing.T) {
	tests := []struct {
		name          string
		base, overlay map[string]any
		path          string
		contains      []string
	}{
		{"scalar", map[string]any{"hostname": "a"}, map[string]any{"hostname": "b"}, "hostname",
			[]string{"merge hostname: conflicting values", `base "a"`, `overlay "b"`}},
		{"scalar types", map[string]any{"x": true}, map[string]any{"x": "true"}, "x", []string{"base true", `overlay "true"`}},
		{"nested scalar", map[string]any{"apt": map[string]any{"p": map[string]any{"q": 1}}},
			map[string]any{"apt": map[string]any{"p": map[string]any{"q": 2}}}, "apt.p.q", []string{"base 1", "overlay 2"}},
		{"user field", map[string]any{"users": []any{map[string]any{"name": "alice", "sudo": "ALL=(ALL) NOPASSWD:ALL"}}},
			map[string]any{"users": []any{map[string]any{"name": "alice", "sudo": false}}}, "users[name=alice].sudo",
			[]string{`base "ALL=(ALL) NOPASSWD:ALL"`, "overlay false"}},
		{"same path", map[string]any{"write_files": []any{map[string]any{"path": "/etc/motd", "content": "a"}}},
			map[string]any{"write_files": []any{map[string]any{"path": "/etc//motd", "content": "b"}}}, "write_files[path=/etc//motd]",
			[]string{"same path", "base map{content,path}"}},
		{"same path within overlay", nil,
			map[string]any{"write_files": []any{map[string]any{"path": "/x"}, map[string]any{"path": "/x"}}}, "write_files[path=/x]", nil},
		{"list vs scalar", map[string]any{"runcmd": []any{"a"}}, map[string]any{"runcmd": "b"}, "runcmd",
			[]string{"cannot merge scalar into a list", "base list(1 items)", `overlay "b"`}},
		{"map vs list", map[string]any{"output": map[string]any{"all": "x"}}, map[string]any{"output": []any{"x"}}, "output",
			[]string{"cannot merge list into a map"}},
		{"scalar vs map", map[string]any{"a": "x"}, map[string]any{"a": map[string]any{"b": 1}}, "a",
			[]string{"cannot merge map into a scalar"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Merge(tc.base, tc.overlay)
			if !errors.Is(err, ErrMerge) {
				t.Fatalf("err = %v, want ErrMerge", err)
			}
			var me *MergeError
			if !errors.As(err, &me) || me.Path != tc.path {
				t.Fatalf("err = %#v, want a *MergeError at %s", err, tc.path)
			}
			for _, s := range tc.contains {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q lacks %q", err, s)
				}
			}
		})
	}
}

func TestMergeDoesNotModifyInputs(t *testing.T) {
	base := map[string]any{"users": []any{map[string]any{"name": "a", "groups": []any{"x"}}}, "m": map[string]any{"k": 1}}
	overlay := map[string]any{"users": []any{map[string]any{"name": "a", "groups": []any{"y"}}}, "m": map[string]any{"j": 2}}
	want := map[string]any{"users": []any{map[string]any{"name": "a", "groups": []any{"x"}}}, "m": map[string]any{"k": 1}}
	if _, err := Merge(base, overlay); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(base, want) {
		t.Errorf("base modified: %#v", base)
	}
}

func TestMergeRejectsNonYAMLValues(t *testing.T) {
	for name, v := range map[string]any{
		"int keys": map[int]string{1: "a"},
		"bytes":    []byte("x"),
		"chan":     make(chan int),
	} {
		if _, err := Merge(nil, map[string]any{"k": v}); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", name, err)
		}
	}
}
