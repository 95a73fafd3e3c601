// Command testplugin is a provider plugin for kloud's tests of the plugin launcher and host
// (e2e/plugin_test.go): installed as kloud-provider-NAME, it serves provider NAME with
// provider/plugin.Run (what plugin.Serve does, with a version to list). Its behaviour depends on
// NAME, so one binary covers the lifecycle tests:
//
//   - every NAME: at start it prints one line "testplugin probe {json}" on stderr (its uid, gid,
//     pid, what it sees of kloud's data directory — two levels above its state directory,
//     <data dir>/plugin-state/NAME —, whether it can read the admin key there, and which
//     environment variables it got), and serves the same JSON at GET /provider/NAME/probe (its
//     Handler).
//   - NAME containing "block": its machines are terraform_data resources (templates plan without
//     a Terraform provider; kloud must then offer no other provider of them, such as dummy), and
//     ApplyTemplate prints "testplugin applyTemplate blocking" and blocks until its call is
//     cancelled (a build in flight, for killing the plugin mid-build). Other plugins' machines are
//     NAME_machine resources.
//   - NAME containing "forkbomb": besides serving, it forks without end: a shell that starts
//     `sleep 300` in the background until a fork is refused, started again (20 ms after it
//     ends) for as long as the plugin lives, so its processes stay at whatever limit it is under.
//   - NAME containing "badver": instead of plugin.Serve, it dials kloud itself and registers
//     claiming plugin API version 99, prints kloud's answer and exits 1.
//
// Start, stop and info answer without doing anything.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/provider/plugin"
)

func main() {
	name := strings.TrimPrefix(filepath.Base(os.Args[0]), "kloud-provider-")
	probe := probeJSON()
	fmt.Fprintf(os.Stderr, "testplugin probe %s\n", probe)
	if strings.Contains(name, "badver") {
		os.Exit(registerBadVersion(name))
	}
	if strings.Contains(name, "forkbomb") {
		go forkBomb()
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /provider/"+name+"/probe", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(probeJSON())
	})
	block := strings.Contains(name, "block")
	p := &provider.Provider{
		Name:         name,
		ResourceType: name + "_machine",
		UserDataAttr: "input",
		Description:  "kloud's test plugin (e2e/testplugin)",
		Stack: func(b *provider.BaseStack) (provider.Stack, error) {
			return &stack{b: b, block: block}, nil
		},
		Machine: func(b *provider.BaseMachine) (provider.Machine, error) { return machine{}, nil },
		Handler: mux,
	}
	if block {
		p.ResourceType = "terraform_data" // templates of it plan without a Terraform provider
	}
	// plugin.Serve, with a version to list (a development build has none).
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := plugin.Run(ctx, p, plugin.Options{Version: Version}); err != nil {
		fmt.Fprintf(os.Stderr, "kloud-provider-%s: %v\n", name, err)
		os.Exit(1)
	}
}

// forkBomb starts a forking shell again and again, never waiting for the sleeps it leaves (the
// sandbox's init reaps them).
func forkBomb() {
	for {
		cmd := exec.Command("/bin/sh", "-c", "while :; do sleep 300 & done")
		if err := cmd.Start(); err == nil {
			_ = cmd.Wait()
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Version is the version the test plugin reports.
const Version = "0.1.0-test"

// probe is what the plugin can see of its host.
type probe struct {
	UID, GID, PID int
	StateDir      string
	// DataDir is kloud's data directory as the plugin guesses it; DataDirEntries what it sees
	// there.
	DataDir        string
	DataDirEntries []string
	ReadKey        string // the error of reading <data dir>/admin.key ("" if it could)
	Env            []string
}

func probeJSON() []byte {
	state := os.Getenv(plugin.EnvStateDir)
	p := probe{UID: os.Getuid(), GID: os.Getgid(), PID: os.Getpid(), StateDir: state}
	if state != "" {
		p.DataDir = filepath.Dir(filepath.Dir(state))
		ents, err := os.ReadDir(p.DataDir)
		if err != nil {
			p.DataDirEntries = []string{"error: " + err.Error()}
		}
		for _, e := range ents {
			p.DataDirEntries = append(p.DataDirEntries, e.Name())
		}
		if _, err := os.ReadFile(filepath.Join(p.DataDir, "admin.key")); err != nil {
			p.ReadKey = err.Error()
		}
	}
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		p.Env = append(p.Env, k)
	}
	b, _ := json.Marshal(p)
	return b
}

type stack struct {
	b     *provider.BaseStack
	block bool
}

func (s *stack) VerifyCredential(context.Context, *provider.Credential) error { return nil }

func (s *stack) BootstrapTemplates(context.Context, *provider.Credential) ([]*provider.Template, error) {
	return nil, nil
}

func (s *stack) ApplyTemplate(ctx context.Context, _ *provider.Credential) (*provider.Template, error) {
	if s.block {
		fmt.Fprintln(os.Stderr, "testplugin applyTemplate blocking")
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return s.b.Template, nil
}

type machine struct{}

func (machine) Start(context.Context) (any, error) { return nil, nil }
func (machine) Stop(context.Context) (any, error)  { return nil, nil }
func (machine) Info(context.Context) (provider.State, any, error) {
	return provider.Running, nil, nil
}

// registerBadVersion registers as a plugin that speaks only plugin API version 99.
func registerBadVersion(name string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	k, err := kite.New(kite.Options{Identity: kite.Identity{Name: "kloud-provider-" + name, Version: "0.0.1"}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "testplugin:", err)
		return 1
	}
	defer k.Close()
	c, err := k.Dial(ctx, os.Getenv(plugin.EnvURL), kite.Auth{Type: kitekey.KindPluginKey, Key: os.Getenv(plugin.EnvKey)})
	if err != nil {
		fmt.Fprintln(os.Stderr, "testplugin: dial:", err)
		return 1
	}
	var res plugin.RegisterResult
	err = c.Call(ctx, plugin.MethodRegister, plugin.RegisterParams{
		Versions: []int{99}, PluginVersion: "0.0.1",
		Provider: plugin.Manifest{Name: name, ResourceType: "terraform_data", UserDataAttr: "input"},
	}, &res)
	if err == nil {
		err = errors.New("kloud accepted plugin API version 99")
	}
	fmt.Fprintln(os.Stderr, "testplugin register refused:", err)
	return 1
}
