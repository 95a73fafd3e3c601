package local_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/local"
	"github.com/kloud-dev/kloud/providers/local/sandbox"
	"github.com/kloud-dev/kloud/providers/local/tfprovider/tfprovidertest"
	"github.com/kloud-dev/kloud/terraformer/tfrun"
	"github.com/kloud-dev/kloud/terraformer/tfrun/tfruntest"
	"github.com/kloud-dev/kloud/terraformer/tfsandbox"
	"github.com/kloud-dev/kloud/userdata"
)

func TestMain(m *testing.M) {
	sandbox.MaybeRunInit() // Machine.Start and the service's creates boot machines from this binary
	tfsandbox.MaybeRun()   // tfrun runs terraform through this binary as its sandbox launcher
	code := m.Run()
	tfprovidertest.Cleanup()
	os.Exit(code)
}

const bootTimeout = 3 * time.Minute

func TestKloudURL(t *testing.T) {
	l, err := local.New(local.Options{Subnet: netip.MustParsePrefix("10.200.7.0/24"), StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	for in, want := range map[string]string{
		"http://127.0.0.1:7000":         "http://10.200.7.1:7000",
		"http://kloud.example:8080/k/":  "http://10.200.7.1:8080/k/",
		"https://kloud.example":         "https://10.200.7.1:443",
		"http://[::1]:7000":             "http://10.200.7.1:7000",
		"http://localhost/path?q=1#top": "http://10.200.7.1:80/path?q=1#top",
	} {
		if got := l.Provider().KloudURL(in); got != want {
			t.Errorf("KloudURL(%q) = %q, want %q", in, got, want)
		}
	}
	p := l.Provider()
	if p.Name != "local" || p.ResourceType != "kloudlocal_machine" || p.UserDataAttr != "user_data" || p.Schema.NewCredential != nil {
		t.Errorf("provider: %+v", p)
	}
	if d := provider.Describe(p); d.Available != (sandbox.Available() == nil) {
		t.Errorf("describe: %+v, sandbox.Available: %v", d, sandbox.Available())
	}
}

// klientServer serves a real klient build on the bridge address, as kloud does, and returns
// kloud's public URL as users would see it (loopback, same port).
func klientServer(t *testing.T, l *local.Local) (publicURL, sum string) {
	t.Helper()
	bin := testutil.BuildBinary(t, "./cmd/klient")
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(b)
	if err := l.SetupNetwork(t.Context()); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(l.HostAddr().String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /dl/klient", func(w http.ResponseWriter, r *http.Request) { w.Write(b) })
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return "http://127.0.0.1:" + port, hex.EncodeToString(h[:])
}

// A stack through kloud's provider and real terraform: ApplyTemplate renders every machine's
// cloud-init (the real provision.sh downloads the real klient from the bridge address), tags and
// provider configuration; terraformer's engine applies it; both machines boot, run the user's
// script and outlive terraform; kloud's Machine operations stop, inspect and start a machine
// terraform made; ConsoleLog reads cloud-init's output, also while stopped; GC removes a machine
// of a dead stack; destroy leaves nothing.
func TestStackThroughTerraform(t *testing.T) {
	h := tfprovidertest.NewHost(t)
	tf, cliConfig := tfprovidertest.Terraform(t)
	// The local machine service on loopback, where terraform's provider reaches it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l, err := local.New(local.Options{
		StateDir: h.StateDir, BaseImage: h.BaseImage, Bridge: h.Bridge, Subnet: h.Subnet, Logger: testutil.Logger(t),
		Instance: "kloud-test", Endpoint: "http://" + ln.Addr().String(),
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: l.Provider().Handler}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	p := l.Provider()
	if err := p.Available(); err != nil {
		t.Fatalf("available: %s", err)
	}
	public, sum := klientServer(t, l)
	kloudURL := p.KloudURL(public)

	const stackID = "stack1"
	src := `provider "kloudlocal" {}

resource "kloudlocal_machine" "web" {
  count     = 2
  hostname  = "node-${count.index}"
  memory    = 512
  tags      = { team = "a" }
  user_data = <<-EOT
    #!/bin/bash
    echo "user script on $(hostname)" > /root/hello
  EOT
}
`
	var specs []*provider.MachineSpec
	for i := range 2 {
		specs = append(specs, &provider.MachineSpec{
			ID: fmt.Sprintf("m%d", i), Label: fmt.Sprintf("web.%d", i), Resource: "web", Index: &i, Provider: "local",
			Owner: "alice", // no planned attributes: kloud cannot evaluate hostname's expression
		})
	}
	b := &provider.BaseStack{
		Provider: p, StackID: stackID, Owner: "alice", Machines: specs, Log: testutil.Logger(t),
		Template: &provider.Template{Files: map[string][]byte{"main.tf": []byte(src)}},
		AgentConfig: func(ctx context.Context, m *provider.MachineSpec) (userdata.Config, error) {
			m.KiteID = "agent-" + m.ID
			return userdata.Config{
				Username: m.Owner, KiteKey: "eyJhbGciOiJFZERTQSJ9.eyJqdGkiOiJ4In0.c2ln", // a JWT's shape; no kontrol here
				KontrolURL: kloudURL + "/kite", KlientURL: kloudURL + "/dl/klient", KlientSHA256: sum,
			}, nil
		},
	}
	st, err := p.Stack(b)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.VerifyCredential(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	tpl, err := st.ApplyTemplate(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := tpl.Files[local.GeneratedFile]; !ok {
		t.Fatalf("no %s in %v", local.GeneratedFile, slices.Collect(maps.Keys(tpl.Files)))
	}

	e := tfruntest.NewEngine(t, tfrun.Options{TerraformPath: tf, CLIConfigFile: cliConfig})
	t0 := time.Now()
	job, err := e.Submit(t.Context(), tfrun.Request{Op: tfrun.OpApply, ContentID: "stack-" + stackID, Files: tpl.Files, Variables: tpl.Variables})
	if err != nil {
		t.Fatal(err)
	}
	if job = tfruntest.Wait(t, e, job.ID, 5*time.Minute); job.Status != tfrun.StatusSucceeded {
		t.Fatalf("apply: %s: %v\n%s", job.Status, job.Err(), strings.Join(job.Log, "\n"))
	}
	t.Logf("terraform apply of 2 machines through the engine: %s", time.Since(t0).Round(time.Millisecond))
	state, err := e.State(t.Context(), "stack-"+stackID)
	if err != nil {
		t.Fatal(err)
	}

	machines := map[string]provider.Machine{}
	infos := map[string]sandbox.Info{}
	for _, r := range state.Values.RootModule.Resources {
		if r.Type != local.ResourceType {
			continue
		}
		i := int(r.Index.(float64))
		spec := specs[i]
		m, err := p.Machine(&provider.BaseMachine{ID: spec.ID, Label: spec.Label, StackID: stackID, Provider: p, Attributes: r.AttributeValues})
		if err != nil {
			t.Fatal(err)
		}
		machines[spec.ID] = m
		id := r.AttributeValues["id"].(string)
		info := waitCloudInit(t, h, id)
		infos[spec.ID] = info
		if got := execIn(t, h, id, "cat", "/root/hello"); got != fmt.Sprintf("user script on node-%d", i) {
			t.Errorf("%s: /root/hello = %q", spec.Label, got)
		}
		if want := map[string]string{"team": "a", local.TagStack: stackID, local.TagMachine: spec.ID, local.TagOwner: spec.Owner}; !maps.Equal(info.Tags, want) {
			t.Errorf("%s: tags %v, want %v", spec.Label, info.Tags, want)
		}
		if _, err := h.Manager.Exec(t.Context(), id, "test", "-x", userdata.KlientPath); err != nil {
			t.Errorf("%s: klient not installed from %s: %s", spec.Label, kloudURL, err)
		}
		if s, meta, err := m.Info(t.Context()); err != nil || s != provider.Running || meta.(map[string]any)["ip_address"] != info.IP.String() {
			t.Errorf("%s: Info = %s %v %v", spec.Label, s, meta, err)
		}
		log, err := m.(provider.ConsoleLogger).ConsoleLog(t.Context())
		if err != nil || !strings.Contains(log, "KLOUD-PROVISION step=done status=ok") || !strings.Contains(log, "Cloud-init v.") {
			t.Errorf("%s: console log (err %v):\n%s", spec.Label, err, log)
		}
	}
	if len(machines) != 2 {
		t.Fatalf("state has %d machines: %+v", len(machines), state.Values.RootModule.Resources)
	}
	t.Logf("apply start to both machines provisioned (klient installed, user script done): %s", time.Since(t0).Round(time.Millisecond))

	// Stop, inspect, start: kloud's own operations on a machine terraform made.
	m0, in0 := machines["m0"], infos["m0"]
	meta, err := m0.Stop(t.Context())
	if err != nil || meta.(map[string]any)["machine_id"] != in0.ID {
		t.Fatalf("stop: %v %v", meta, err)
	}
	if s, _, err := m0.Info(t.Context()); err != nil || s != provider.Stopped {
		t.Fatalf("info after stop: %s %v", s, err)
	}
	if log, err := m0.(provider.ConsoleLogger).ConsoleLog(t.Context()); err != nil || !strings.Contains(log, "KLOUD-PROVISION step=done status=ok") {
		t.Errorf("console log of a stopped machine (err %v):\n%s", err, log)
	}
	if meta, err = m0.Start(t.Context()); err != nil || meta.(map[string]any)["ip_address"] != in0.IP.String() {
		t.Fatalf("start: %v %v", meta, err)
	}
	if s, _, err := m0.Info(t.Context()); err != nil || s != provider.Running {
		t.Fatalf("info after start: %s %v", s, err)
	}
	waitCloudInit(t, h, in0.ID)
	if got := execIn(t, h, in0.ID, "cat", "/root/hello"); got != "user script on node-0" {
		t.Errorf("disk after stop/start: /root/hello = %q", got)
	}
	// The agent comes back on its own after a start (cloud-init per-boot script).
	testutil.Eventually(t, time.Minute, func() bool {
		_, err := h.Manager.Exec(t.Context(), in0.ID, "sh", "-c", "kill -0 $(cat "+userdata.SupervisorPIDPath+")")
		return err == nil
	}, "klient supervisor not running after start")

	// Startup sweep: machine m1's stack is gone from kloud.
	removed, err := l.GC(t.Context(), func(stack, machine string) bool { return machine != "m1" })
	if err != nil || !slices.Equal(removed, []string{infos["m1"].ID}) {
		t.Fatalf("gc removed %v (%v), want [%s]", removed, err, infos["m1"].ID)
	}
	if s, _, err := machines["m1"].Info(t.Context()); err != nil || s != provider.Terminated {
		t.Errorf("info of a removed machine: %s %v", s, err)
	}
	if _, err := machines["m1"].Start(t.Context()); !errors.Is(err, kite.ErrNotFound) {
		t.Errorf("start of a removed machine: %v, want kite.ErrNotFound", err)
	}
	h.AssertGone(t, infos["m1"])

	// Destroy through terraform (one machine already gone): nothing is left.
	t0 = time.Now()
	// As kloud destroys a stack: the template configured again without machines (a fresh token
	// that may create nothing, no agent keys), so the destroy never runs on an expired token.
	st2, err := p.Stack(&provider.BaseStack{Provider: p, StackID: stackID, Owner: "alice", Log: testutil.Logger(t),
		Template: &provider.Template{Files: map[string][]byte{"main.tf": []byte(src)}, Variables: map[string]any{}}})
	if err != nil {
		t.Fatal(err)
	}
	dtpl, err := st2.ApplyTemplate(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	job, err = e.Submit(t.Context(), tfrun.Request{Op: tfrun.OpDestroy, ContentID: "stack-" + stackID, Files: dtpl.Files, Variables: dtpl.Variables})
	if err != nil {
		t.Fatal(err)
	}
	if job = tfruntest.Wait(t, e, job.ID, 5*time.Minute); job.Status != tfrun.StatusSucceeded {
		t.Fatalf("destroy: %s: %v\n%s", job.Status, job.Err(), strings.Join(job.Log, "\n"))
	}
	t.Logf("terraform destroy through the engine: %s", time.Since(t0).Round(time.Millisecond))
	h.AssertGone(t, infos["m0"])
	if left, _ := h.Manager.List(t.Context()); len(left) != 0 {
		t.Errorf("machines left after destroy: %+v", left)
	}
	if _, err := p.Machine(&provider.BaseMachine{Label: "x", Attributes: map[string]any{}}); err == nil {
		t.Error("Machine without an id attribute: no error")
	}
}

func waitCloudInit(t *testing.T, h *tfprovidertest.Host, id string) sandbox.Info {
	t.Helper()
	var info sandbox.Info
	console := func() string {
		b, _ := os.ReadFile(info.Dir + "/console.log")
		return string(b)
	}
	testutil.Eventually(t, bootTimeout, func() bool {
		var err error
		if info, err = h.Manager.Info(t.Context(), id); err != nil {
			t.Fatal(err)
		}
		if info.State != sandbox.StateRunning {
			t.Fatalf("machine %s is %s while waiting for cloud-init:\n%s", id, info.State, console())
		}
		return info.CloudInit == sandbox.CloudInitDone || info.CloudInit == sandbox.CloudInitError
	}, "cloud-init in %s did not finish", id)
	if info.CloudInit != sandbox.CloudInitDone {
		t.Fatalf("cloud-init in %s: %s\n%s", id, info.CloudInit, console())
	}
	return info
}

func execIn(t *testing.T, h *tfprovidertest.Host, id string, argv ...string) string {
	t.Helper()
	out, err := h.Manager.Exec(t.Context(), id, argv...)
	if err != nil {
		t.Fatalf("exec %v in %s: %s", argv, id, err)
	}
	return strings.TrimSpace(string(out))
}
