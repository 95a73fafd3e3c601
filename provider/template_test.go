package provider_test

import (
	"testing"

	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/provider/tmpl"
)

// Parsed hands on the Config a caller parsed while it still holds Files, and parses again once
// someone changed the files behind it (a provider adding a generated file to the map).
func TestTemplateParsedFollowsFiles(t *testing.T) {
	files := map[string][]byte{"main.tf": []byte("resource \"terraform_data\" \"web\" {\n  input = \"a\"\n}\n")}
	cfg, err := tmpl.Parse(files)
	if err != nil {
		t.Fatal(err)
	}
	tpl := &provider.Template{Files: files, Config: cfg}
	got, err := tpl.Parsed()
	if err != nil || got != cfg {
		t.Fatalf("Parsed: %p, %v; want the given config %p", got, err, cfg)
	}
	tpl.Files["extra.tf"] = []byte("variable \"x\" {}\n")
	got, err = tpl.Parsed()
	if err != nil || got == cfg {
		t.Fatalf("Parsed after a change: %p, %v; want a fresh parse", got, err)
	}
	if vs := got.Variables(); len(vs) != 1 || vs[0].Name != "x" {
		t.Fatalf("fresh parse misses the new file: %+v", vs)
	}
	if again, _ := tpl.Parsed(); again != got {
		t.Fatal("the fresh parse is not kept")
	}
	tpl.Files["main.tf"] = []byte("# changed\n")
	if again, _ := tpl.Parsed(); again == got {
		t.Fatal("a changed file's content is not noticed")
	}
}
