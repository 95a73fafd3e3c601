package docker

import (
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/provider/tmpl"
)

const userDataHCL = `resource "docker_container" "vm" {
  count = 2
  name  = "vm-${count.index}"
  image = "kloud"
  labels {
    label = "kloud_user_data"
    value = <<-EOT
      #!/bin/sh
      echo hello > /root/hello
    EOT
  }
}
`

const userDataJSON = `{"resource": {"docker_container": {"vm": {"count": 2, "name": "vm-${count.index}", "image": "kloud",
  "labels": {"label": "kloud_user_data", "value": "#!/bin/sh\necho hello > /root/hello\n"}}}}}`

// A template's own user data on docker machines: one labels block with label kloud_user_data
// is allowed (HCL and JSON); any other label, a second one, a computed label name or a dynamic
// labels block is refused with file and line.
func TestCheckTemplateUserDataLabel(t *testing.T) {
	t.Parallel()
	for name, files := range map[string]map[string][]byte{
		"hcl":  {"main.tf": []byte(userDataHCL)},
		"json": {"main.tf.json": []byte(userDataJSON)},
		"json array": {"main.tf.json": []byte(`{"resource": [{"docker_container": {"vm": [{"name": "x", "image": "kloud",
  "labels": [{"label": "kloud_user_data", "value": "echo hi"}]}]}}]}`)},
	} {
		if err := CheckTemplate(files); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	for name, body := range map[string]string{
		"other label":    "labels {\n label = \"kloud_stack\"\n value = \"x\"\n}",
		"two":            "labels {\n label = \"kloud_user_data\"\n value = \"a\"\n}\n labels {\n label = \"kloud_user_data\"\n value = \"b\"\n}",
		"computed label": "labels {\n label = var.l\n value = \"x\"\n}",
		"no label":       "labels {\n value = \"x\"\n}",
		"dynamic":        "dynamic \"labels\" {\n for_each = [1]\n content {\n label = \"kloud_user_data\"\n value = \"x\"\n }\n}",
	} {
		src := "resource \"docker_container\" \"vm\" {\n  name  = \"x\"\n  image = \"kloud\"\n  " + body + "\n}\n"
		err := CheckTemplate(map[string][]byte{"main.tf": []byte(src)})
		if err == nil || !strings.Contains(err.Error(), "docker_container.vm") || !strings.Contains(err.Error(), "labels") {
			t.Errorf("%s: got %v", name, err)
		} else if name != "two" && !strings.Contains(err.Error(), "main.tf:4: ") {
			t.Errorf("%s: %v: want file and line", name, err)
		}
	}
	err := CheckTemplate(map[string][]byte{"main.tf.json": []byte(`{"resource": {"docker_container": {"vm": {"name": "x", "image": "kloud",
  "labels": [{"label": "kloud_user_data", "value": "a"}, {"label": "kloud_owner", "value": "mallory"}]}}}}`)})
	if err == nil || !strings.Contains(err.Error(), "labels is not allowed") {
		t.Errorf("json with another label: %v", err)
	}
}

// The user data is read per machine (the literal, else the planned value) and the block is
// removed from the files, keeping HCL's line numbers; no other labels block survives either.
func TestUserScripts(t *testing.T) {
	t.Parallel()
	ms := []*provider.MachineSpec{{ID: "m0", Resource: "vm", Index: new(0)}, {ID: "m1", Resource: "vm", Index: new(1)}}
	for name, files := range map[string]map[string][]byte{
		"hcl":  {"main.tf": []byte(userDataHCL)},
		"json": {"main.tf.json": []byte(userDataJSON)},
	} {
		cfg, err := tmpl.Parse(files)
		if err != nil {
			t.Fatal(err)
		}
		got := userScripts(cfg, "vm", ms)
		for i, s := range got {
			if s != "#!/bin/sh\necho hello > /root/hello\n" {
				t.Errorf("%s: machine %d: user data %q", name, i, s)
			}
		}
		stripped, err := stripUserData(files)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for n, src := range stripped {
			if strings.Contains(string(src), "labels") && !strings.Contains(string(src), "# labels kloud_user_data") || strings.Contains(string(src), "echo hello") {
				t.Errorf("%s: %s still has the labels block:\n%s", name, n, src)
			}
			if !strings.HasSuffix(n, ".json") && strings.Count(string(src), "\n") != strings.Count(userDataHCL, "\n") {
				t.Errorf("%s: line count changed:\n%s", name, src)
			}
		}
		if _, err := tmpl.Parse(stripped); err != nil {
			t.Errorf("%s: the stripped files do not parse: %v", name, err)
		}
		if err := CheckTemplate(stripped); err != nil {
			t.Errorf("%s: stripped: %v", name, err)
		}
	}
	// An expression: each machine gets its planned value.
	src := strings.Replace(userDataHCL, "echo hello > /root/hello", "echo ${count.index} > /root/hello", 1)
	cfg, err := tmpl.Parse(map[string][]byte{"main.tf": []byte(src)})
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range ms {
		m.Attributes = map[string]any{"labels": []any{map[string]any{"label": UserDataLabel, "value": "#!/bin/sh\necho " + string(rune('0'+i)) + "\n"}}}
	}
	got := userScripts(cfg, "vm", ms)
	if got[0] != "#!/bin/sh\necho 0\n" || got[1] != "#!/bin/sh\necho 1\n" {
		t.Errorf("planned user data: %q", got)
	}
	// As kloud's store hands the planned values back: its own slice and map types.
	type bsonA []any
	type bsonM map[string]any
	ms[0].Attributes = map[string]any{"labels": bsonA{bsonM{"label": "other", "value": "x"}, bsonM{"label": UserDataLabel, "value": "from the store"}}}
	if got := userScripts(cfg, "vm", ms[:1]); got[0] != "from the store" {
		t.Errorf("planned user data from the store's types: %q", got)
	}
	// No label: no user data.
	cfg, _ = tmpl.Parse(map[string][]byte{"main.tf": []byte("resource \"docker_container\" \"vm\" {\n  name = \"x\"\n  image = \"kloud\"\n}\n")})
	if got := userScripts(cfg, "vm", []*provider.MachineSpec{{ID: "m", Resource: "vm"}}); got[0] != "" {
		t.Errorf("without the label: %q", got)
	}
}
