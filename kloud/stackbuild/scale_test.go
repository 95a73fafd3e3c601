package stackbuild

import (
	"errors"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/model"
)

// TestScaleFiles: a literal count is replaced in place (the rest of the file byte for byte), a
// count that is a declared variable changes the variable, anything else is refused saying why.
func TestScaleFiles(t *testing.T) {
	t.Parallel()
	types := []string{"kloudlocal_machine", "terraform_data"}
	main := `# my machines
resource "kloudlocal_machine" "vm" {
  count    = 2 # two of them
  hostname = "vm-${count.index}"
}

variable "n" {
  type = number
}

resource "kloudlocal_machine" "db" {
  count    = var.n
  hostname = "db"
}

resource "kloudlocal_machine" "calc" {
  count    = var.n + 1
  hostname = "calc"
}

resource "kloudlocal_machine" "one" {
  hostname = "one"
}
`
	files := []model.File{{Name: "main.tf", Content: main}, {Name: "other.tf.json", Content: `{"resource": {"terraform_data": {"j": {"count": 1}}}}`}}
	vars := map[string]string{"n": "1"}

	out, v, err := ScaleFiles(files, vars, types, "vm", 5)
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.Replace(main, "count    = 2 #", "count    = 5 #", 1); out[0].Content != want || v["n"] != "1" {
		t.Fatalf("literal:\n%s\nvars %v", out[0].Content, v)
	}
	if files[0].Content != main {
		t.Fatal("scaleFiles changed its input")
	}

	out, v, err = ScaleFiles(files, vars, types, "db", 3)
	if err != nil {
		t.Fatal(err)
	}
	if out[0].Content != main || v["n"] != "3" || vars["n"] != "1" {
		t.Fatalf("variable: vars %v (input %v)", v, vars)
	}

	out, _, err = ScaleFiles(files, vars, types, "j", 4)
	if err != nil || out[1].Content != `{"resource": {"terraform_data": {"j": {"count": 4}}}}` {
		t.Fatalf("json literal: %v %s", err, out[1].Content)
	}

	for _, c := range []struct {
		name string
		want string
		code error
	}{
		{"calc", "count is the expression `var.n + 1`", kite.ErrInvalidParams},
		{"one", "has no count", kite.ErrInvalidParams},
		{"nope", "declare no machine resource", kite.ErrNotFound},
	} {
		_, _, err := ScaleFiles(files, vars, types, c.name, 2)
		if err == nil || !strings.Contains(err.Error(), c.want) || !errors.Is(err, c.code) {
			t.Errorf("%s: %v; want %q", c.name, err, c.want)
		}
	}
}
