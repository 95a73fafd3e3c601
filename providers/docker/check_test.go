package docker

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// Hostile templates: every docker_container argument that reaches the host is refused by
// CheckTemplate, with the file and line, in HCL and in JSON, also as a dynamic block.
func TestCheckTemplateRefusesHostArguments(t *testing.T) {
	t.Parallel()
	hostile := map[string]string{
		"privileged":        `privileged = true`,
		"volumes":           "volumes {\n host_path = \"/\"\n container_path = \"/host\"\n}",
		"mounts":            "mounts {\n type = \"bind\"\n source = \"/var/run/docker.sock\"\n target = \"/d.sock\"\n}",
		"devices":           "devices {\n host_path = \"/dev/sda\"\n}",
		"pid_mode":          `pid_mode = "host"`,
		"ipc_mode":          `ipc_mode = "host"`,
		"userns_mode":       `userns_mode = "host"`,
		"cgroupns_mode":     `cgroupns_mode = "host"`,
		"network_mode":      `network_mode = "host"`,
		"networks_advanced": "networks_advanced {\n name = \"host\"\n}",
		"capabilities":      "capabilities {\n add = [\"ALL\"]\n}",
		"security_opts":     `security_opts = ["apparmor=unconfined", "seccomp=unconfined"]`,
		"sysctls":           `sysctls = { "kernel.core_pattern" = "|/bin/sh" }`,
		"runtime":           `runtime = "runc"`,
		"gpus":              `gpus = "all"`,
		"ports":             "ports {\n internal = 22\n external = 22\n}",
		"publish_all_ports": `publish_all_ports = true`,
		"group_add":         `group_add = ["docker"]`,
		"user":              `user = "0:0"`,
		"cgroup_parent":     `cgroup_parent = "/"`,
		"log_driver":        `log_driver = "syslog"`,
		"log_opts":          `log_opts = { "syslog-address" = "tcp://10.0.0.1:514" }`,
		"upload":            "upload {\n file = \"/x\"\n source = \"/etc/shadow\"\n}",
		"entrypoint":        `entrypoint = ["/bin/sh"]`,
		"command":           `command = ["sleep", "1"]`,
		"labels":            "labels {\n label = \"kloud_stack\"\n value = \"other\"\n}",
		"init":              `init = true`,
		"host":              "host {\n host = \"x\"\n ip = \"1.2.3.4\"\n}",
		"storage_opts":      `storage_opts = { size = "1T" }`,
		"ulimit":            "ulimit {\n name = \"nofile\"\n soft = 1\n hard = 1\n}",
		"for_each":          `for_each = toset(["a"])`,
		"provider":          `provider = docker.other`,
		"dynamic volumes":   "dynamic \"volumes\" {\n for_each = [1]\n content {\n host_path = \"/\"\n container_path = \"/h\"\n }\n}",
	}
	for name, body := range hostile {
		src := "resource \"docker_container\" \"vm\" {\n  name  = \"x\"\n  image = \"kloud\"\n  " + body + "\n}\n"
		err := CheckTemplate(map[string][]byte{"main.tf": []byte(src)})
		want := strings.TrimPrefix(name, "dynamic ")
		if err == nil || !strings.Contains(err.Error(), "main.tf:4: docker_container.vm: "+want+" is not allowed") {
			t.Errorf("%s: got %v", name, err)
		}
	}
	// The same in JSON, and a dynamic block in JSON.
	for name, js := range map[string]string{
		"privileged": `"privileged": true`,
		"volumes":    `"volumes": [{"host_path": "/", "container_path": "/h"}]`,
		"dynamic":    `"dynamic": {"mounts": {"for_each": [1], "content": {"type": "bind", "source": "/", "target": "/h"}}}`,
	} {
		src := `{"resource": {"docker_container": {"vm": {"name": "x", "image": "kloud", ` + js + `}}}}`
		err := CheckTemplate(map[string][]byte{"main.tf.json": []byte(src)})
		if err == nil || !strings.Contains(err.Error(), "is not allowed") {
			t.Errorf("json %s: got %v", name, err)
		}
	}
	if err := CheckTemplate(map[string][]byte{"main.tf.json": []byte(`{"resource": {"docker_container": {"vm": {"name": "x", "image": "kloud", "dynamic": {"mounts": {}}}}}}`)}); err == nil || !strings.Contains(err.Error(), "mounts is not allowed") {
		t.Errorf("json dynamic mounts: %v", err)
	}
}

// A machine with the allowed arguments passes.
func TestCheckTemplateAllowsMachineArguments(t *testing.T) {
	t.Parallel()
	src := `variable "mem" { default = 512 }
resource "docker_container" "vm" {
  count      = 2
  name       = "vm-${count.index}"
  image      = "kloud"
  hostname   = "vm-${count.index}"
  memory     = var.mem
  cpus       = "0.5"
  env        = ["A=b"]
  tmpfs      = { "/scratch" = "size=64m" }
  depends_on = []
  lifecycle {
    ignore_changes = [env]
  }
}
resource "docker_container" "other_type_elsewhere" {
  name  = "y"
  image = "kloud"
}
`
	if err := CheckTemplate(map[string][]byte{"main.tf": []byte(src)}); err != nil {
		t.Fatal(err)
	}
}

// The proxy's allowlist on the real create request (a third wall behind the template check and
// the planned attributes): only a listed machine of the token's stack, kloud's image, network
// and entrypoint, and nothing that reaches the host.
func TestCreateAllowed(t *testing.T) {
	t.Parallel()
	d, err := New(Options{Host: "unix:///nonexistent.sock", Image: "kloud/machine:t", Instance: "i1", StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	tok := &token{Stack: "s1", Machines: []string{"m1"}, Instance: "i1", Expires: time.Now().Add(time.Hour).Unix()}
	base := func() map[string]any {
		return map[string]any{
			"Image":      "kloud/machine:t",
			"Entrypoint": []string{BootPath},
			"Hostname":   "vm-0",
			"Env":        []string{"A=b"},
			"Labels":     map[string]string{LabelStack: "s1", LabelMachine: "m1", LabelInstance: "i1", LabelOwner: "alice"},
			"HostConfig": map[string]any{
				"NetworkMode": DefaultNetwork, "Memory": 536870912, "NanoCpus": 500000000, "Privileged": false,
				"Binds": nil, "CapAdd": nil, "CapDrop": []string{"NET_RAW"}, "LogConfig": map[string]any{"Type": "json-file", "Config": map[string]string{}},
				"RestartPolicy": map[string]any{"Name": "no"}, "IpcMode": "", "PidMode": "",
			},
			"NetworkingConfig": map[string]any{"EndpointsConfig": map[string]any{DefaultNetwork: map[string]any{}}},
		}
	}
	body := func(edit func(m map[string]any)) []byte {
		m := base()
		if edit != nil {
			edit(m)
		}
		b, _ := json.Marshal(m)
		return b
	}
	hc := func(k string, v any) func(m map[string]any) {
		return func(m map[string]any) { m["HostConfig"].(map[string]any)[k] = v }
	}
	if err := d.createAllowed(tok, body(nil), "kloud/machine:t"); err != nil {
		t.Fatalf("a kloud machine: %v", err)
	}
	for name, c := range map[string]struct {
		edit func(m map[string]any)
		want string
	}{
		"privileged":       {hc("Privileged", true), "HostConfig.Privileged"},
		"binds":            {hc("Binds", []string{"/:/host"}), "HostConfig.Binds"},
		"docker socket":    {hc("Mounts", []any{map[string]any{"Type": "bind", "Source": "/var/run/docker.sock", "Target": "/s"}}), "HostConfig.Mounts"},
		"devices":          {hc("Devices", []any{map[string]any{"PathOnHost": "/dev/sda"}}), "HostConfig.Devices"},
		"pid host":         {hc("PidMode", "host"), "HostConfig.PidMode"},
		"ipc host":         {hc("IpcMode", "host"), "HostConfig.IpcMode host"},
		"uts host":         {hc("UTSMode", "host"), "HostConfig.UTSMode"},
		"userns host":      {hc("UsernsMode", "host"), "HostConfig.UsernsMode"},
		"cgroupns host":    {hc("CgroupnsMode", "host"), "HostConfig.CgroupnsMode host"},
		"host network":     {hc("NetworkMode", "host"), "HostConfig.NetworkMode"},
		"cap add":          {hc("CapAdd", []string{"SYS_ADMIN"}), "HostConfig.CapAdd"},
		"security opt":     {hc("SecurityOpt", []string{"seccomp=unconfined"}), "HostConfig.SecurityOpt"},
		"sysctls":          {hc("Sysctls", map[string]string{"net.ipv4.ip_forward": "1"}), "HostConfig.Sysctls"},
		"runtime":          {hc("Runtime", "runsc"), "HostConfig.Runtime"},
		"gpus":             {hc("DeviceRequests", []any{map[string]any{"Count": -1}}), "HostConfig.DeviceRequests"},
		"ports":            {hc("PortBindings", map[string]any{"22/tcp": []any{map[string]any{"HostPort": "22"}}}), "HostConfig.PortBindings"},
		"publish all":      {hc("PublishAllPorts", true), "HostConfig.PublishAllPorts"},
		"unmasked /proc":   {hc("MaskedPaths", []string{}), "HostConfig.MaskedPaths"},
		"cgroup parent":    {hc("CgroupParent", "/"), "HostConfig.CgroupParent"},
		"syslog":           {hc("LogConfig", map[string]any{"Type": "syslog"}), "HostConfig.LogConfig.Type syslog"},
		"volumes from":     {hc("VolumesFrom", []string{"other"}), "HostConfig.VolumesFrom"},
		"anonymous volume": {func(m map[string]any) { m["Volumes"] = map[string]any{"/data": map[string]any{}} }, "Volumes"},
		"user":             {func(m map[string]any) { m["User"] = "1000" }, "User"},
		"other image":      {func(m map[string]any) { m["Image"] = "alpine" }, "Image"},
		"other entrypoint": {func(m map[string]any) { m["Entrypoint"] = []string{"/bin/sh"} }, "Entrypoint"},
		"other network endpoint": {func(m map[string]any) {
			m["NetworkingConfig"] = map[string]any{"EndpointsConfig": map[string]any{"host": map[string]any{}}}
		}, "NetworkingConfig.EndpointsConfig.host"},
		"other stack":      {func(m map[string]any) { m["Labels"].(map[string]string)[LabelStack] = "s2" }, "must name this stack"},
		"unlisted machine": {func(m map[string]any) { m["Labels"].(map[string]string)[LabelMachine] = "m2" }, "not one this build may create"},
		"no labels":        {func(m map[string]any) { delete(m, "Labels") }, "must name this stack"},
		"other instance":   {func(m map[string]any) { m["Labels"].(map[string]string)[LabelInstance] = "i2" }, "must name this stack"},
	} {
		err := d.createAllowed(tok, body(c.edit), "kloud/machine:t")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error naming %q", name, err, c.want)
		}
	}
	expired := *tok
	expired.Expires = time.Now().Add(-time.Minute).Unix()
	if err := d.createAllowed(&expired, body(nil), "kloud/machine:t"); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Errorf("expired token: %v", err)
	}
}

// Tokens: signed, bound to the instance; a tampered one is refused.
func TestToken(t *testing.T) {
	t.Parallel()
	d, _ := New(Options{Host: "unix:///x.sock", Image: "i", Instance: "i1", StateDir: t.TempDir()})
	s, err := d.sign(token{Stack: "s1", Machines: []string{"m1"}})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := d.parseToken(s)
	if err != nil || tok.Stack != "s1" || !tok.mayCreate("m1") || tok.mayCreate("m2") {
		t.Fatalf("%+v %v", tok, err)
	}
	p, sig, _ := strings.Cut(s, ".")
	if _, err := d.parseToken(p + "x." + sig); err == nil {
		t.Error("tampered token accepted")
	}
	other, _ := New(Options{Host: "unix:///x.sock", Image: "i", Instance: "i2", StateDir: d.opts.StateDir})
	if _, err := other.parseToken(s); err == nil {
		t.Error("another instance's token accepted")
	}
}
