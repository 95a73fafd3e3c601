package sandbox

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/kloud-dev/kloud/internal/cgroups"
)

// forwarded are the signals the launcher and init pass on to their child.
var forwarded = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT}

// launch is stage 1, started by terraform-exec with terraform's arguments. It starts init in new
// namespaces and mirrors it: signals in, exit status out.
func launch() int {
	cfg, err := readConfig()
	if err != nil {
		return fail(err)
	}
	if cfg.Insecure {
		env := envWithout(true) // the token stays, so that Kill finds what terraform started
		args := append([]string{cfg.Program}, os.Args[1:]...)
		return fail(fmt.Errorf("exec %s: %w", cfg.Program, syscall.Exec(cfg.Program, args, env)))
	}
	// Pdeathsig belongs to the thread that forks: keep init's parent thread alive for good.
	runtime.LockOSThread()
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, forwarded...)

	if cfg.Limits != nil {
		rel := cfg.cgroupName(os.Getenv(EnvRun))
		if err := joinCgroup(cfg, rel); err != nil {
			_ = cgroups.Leave()
			_ = cgroups.Remove(rel)
			return fail(fmt.Errorf("cgroup limits: %w", err))
		}
		defer func() {
			if err := leaveCgroup(rel); err != nil {
				fmt.Fprintf(os.Stderr, "sandbox: %v\n", err)
			}
		}()
	}
	cmd := exec.Command("/proc/self/exe", os.Args[1:]...)
	cmd.Args[0] = "tfsandbox-init"
	cmd.Env = append(envWithout(true), envStage+"="+stageInit, envConfig+"="+os.Getenv(envConfig))
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: unix.CLONE_NEWPID | unix.CLONE_NEWNS | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS,
		Pdeathsig:  syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		return fail(fmt.Errorf("start the sandbox (new pid and mount namespaces): %w", err))
	}
	done := make(chan struct{})
	go func() {
		for {
			select {
			case sig := <-signals:
				_ = cmd.Process.Signal(sig)
			case <-done:
				return
			}
		}
	}()
	err = cmd.Wait()
	close(done)
	return exitCode(err)
}

// exitCode turns a child's end into ours: its exit code, 128+n for a signal.
func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	return fail(err)
}

func fail(err error) int {
	fmt.Fprintf(os.Stderr, "sandbox: %v\n", err)
	return 125
}
