package tfrun

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/terraform-exec/tfexec"
	tfjson "github.com/hashicorp/terraform-json"

	"github.com/kloud-dev/kloud/internal/atomicfile"
)

const (
	logTailLines  = 200
	stderrTail    = 20
	persistEvery  = 250 * time.Millisecond
	watchQueueMax = 1024
	lockTimeout   = "10s"
)

// cancelCause is why a run's graceful context was cancelled; the first cause wins.
type cancelCause struct {
	kind   string
	status Status
	msg    string
}

func (c *cancelCause) Error() string { return c.msg }

// run is one job while it runs in this process.
type run struct {
	e     *Engine
	id    string
	req   Request
	stack string // stacks/<contentID>
	work  string // stacks/<contentID>/work
	lease leaseFile
	log   *slog.Logger

	ctx    context.Context // graceful: cancelled → SIGINT
	cancel context.CancelCauseFunc
	kill   context.Context // hard: cancelled → SIGKILL now
	killFn context.CancelFunc
	done   chan struct{}

	lastOutput atomic.Int64 // unix nanos of terraform's last output

	mu           sync.Mutex
	job          *Job
	resIndex     map[string]int
	watchers     map[*watcher]struct{}
	diags        []Diagnostic
	stderr       []string
	textOut      strings.Builder // init's stderr, for its diagnostics
	planSummary  *uiChangeSummary
	finalSummary *uiChangeSummary
	dirty        bool
	phase        string // the terraform command running or last run: "init", "apply", ...
	opStarted    bool   // the operation itself (not just init) ran, so the state may have changed
	lastPersist  time.Time
	logFile      *os.File
	kept         *keptContent // a preview's stored content, put back when it ends (preview.go)
}

func newRun(e *Engine, req Request, job *Job, lf leaseFile) *run {
	r := &run{
		e:        e,
		id:       job.ID,
		req:      req,
		stack:    lf.dir,
		work:     filepath.Join(lf.dir, "work"),
		lease:    lf,
		log:      e.log.With("job_id", job.ID, "content_id", req.ContentID, "op", req.Op, "trace_id", req.TraceID),
		done:     make(chan struct{}),
		job:      job,
		resIndex: map[string]int{},
		watchers: map[*watcher]struct{}{},
	}
	r.ctx, r.cancel = context.WithCancelCause(context.Background())
	r.kill, r.killFn = context.WithCancel(context.Background())
	return r
}

func (r *run) stop(cause *cancelCause) { r.cancel(cause) }
func (r *run) killNow()                { r.killFn() }
func (r *run) touch()                  { r.lastOutput.Store(time.Now().UnixNano()) }

func (r *run) setPhase(p string) {
	r.mu.Lock()
	r.phase = p
	r.opStarted = r.opStarted || p == string(r.req.Op)
	r.mu.Unlock()
}

func (r *run) snapshot() *Job {
	r.mu.Lock()
	defer r.mu.Unlock()
	return cloneJob(r.job)
}

// execute is the whole life of the run, on its own goroutine.
func (r *run) execute() {
	defer r.killFn()
	defer r.cancel(nil)
	f, err := os.OpenFile(filepath.Join(r.e.jobsDir, r.id+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		r.log.Warn("open job log", "err", err)
	}
	r.logFile = f

	r.mu.Lock()
	r.job.Status = StatusRunning
	r.job.StartedAt = time.Now().UTC()
	r.publishLocked(Event{Type: EventStatus})
	r.persistLocked()
	r.mu.Unlock()
	r.log.Info("job running")

	r.touch()
	stopBackground := r.background()
	opErr := r.perform()
	result := r.result(opErr)
	r.restorePreviewed() // preview.go
	stopBackground()

	job := r.finish(opErr, result)
	if err := r.lease.release(r.e.opts.Owner, r.id); err != nil {
		r.log.Warn("release lease", "err", err)
	}
	r.e.mu.Lock()
	delete(r.e.active, r.id)
	delete(r.e.byContent, r.req.ContentID)
	r.e.mu.Unlock()

	r.mu.Lock()
	r.publishLocked(finalEvent(job))
	r.mu.Unlock()
	if r.logFile != nil {
		r.logFile.Close()
	}
	r.log.Info("job finished", "status", job.Status, "err", job.Err())
	close(r.done)
}

// background renews the lease and watches for a hang until the returned func is called.
func (r *run) background() (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(r.e.opts.LeaseTTL / 3)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			err := r.lease.renew(r.e.opts.Owner, r.id, r.e.opts.LeaseTTL)
			if errors.Is(err, ErrLocked) {
				r.log.Error("lease lost, cancelling", "err", err)
				r.stop(&cancelCause{kind: KindLease, status: StatusFailed, msg: "lease lost: another terraformer took the content id"})
				return
			}
			if err != nil {
				r.log.Warn("renew lease", "err", err)
			}
		}
	})
	wg.Go(func() {
		hang := r.e.opts.HangTimeout
		t := time.NewTicker(min(max(hang/5, 5*time.Millisecond), time.Second))
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if r.ctx.Err() == nil && time.Since(time.Unix(0, r.lastOutput.Load())) > hang {
				r.log.Error("terraform hung, cancelling", "hang_timeout", hang)
				r.stop(&cancelCause{kind: KindHung, status: StatusHung,
					msg: fmt.Sprintf("hung: no output from terraform for %s", hang)})
			}
			r.mu.Lock()
			if r.dirty {
				r.persistLocked()
			}
			r.mu.Unlock()
		}
	})
	return func() {
		cancel()
		wg.Wait()
	}
}

// perform writes the content, runs init if needed, then the operation.
func (r *run) perform() error {
	if err := r.prepare(); err != nil {
		return err
	}
	if err := r.init(); err != nil {
		return err
	}
	var varFile []string
	if _, err := os.Stat(r.varsPath()); err == nil {
		varFile = []string{r.varsPath()}
	}
	lock := tfexec.LockTimeout(lockTimeout)
	switch r.req.Op {
	case OpPlan:
		return r.terraformJSON("plan", varFile, func(ctx context.Context, tf *tfexec.Terraform, w io.Writer) error {
			opts := []tfexec.PlanOption{tfexec.Out(r.planPath()), lock}
			for _, f := range varFile {
				opts = append(opts, tfexec.VarFile(f))
			}
			_, err := tf.PlanJSON(ctx, w, opts...)
			return err
		})
	case OpApply:
		return r.terraformJSON("apply", varFile, func(ctx context.Context, tf *tfexec.Terraform, w io.Writer) error {
			opts := []tfexec.ApplyOption{lock}
			for _, f := range varFile {
				opts = append(opts, tfexec.VarFile(f))
			}
			return tf.ApplyJSON(ctx, w, opts...)
		})
	case OpDestroy:
		return r.terraformJSON("destroy", varFile, func(ctx context.Context, tf *tfexec.Terraform, w io.Writer) error {
			opts := []tfexec.DestroyOption{lock}
			for _, f := range varFile {
				opts = append(opts, tfexec.VarFile(f))
			}
			return tf.DestroyJSON(ctx, w, opts...)
		})
	}
	return fmt.Errorf("op %q: %w", r.req.Op, ErrInvalid)
}

// varsPath is outside the work dir, and bound read-only into the sandbox: terraform can read the
// variables but not replace them.
func (r *run) varsPath() string { return filepath.Join(r.stack, "variables.json") }

// planPath is in the work dir: terraform writes it.
func (r *run) planPath() string { return filepath.Join(r.work, ".kloud-plan.out") }

// prepare replaces the stored content files and variables with the request's, and gives the work
// dir and the variables file to the sandbox's user.
func (r *run) prepare() error {
	if err := os.MkdirAll(r.work, 0o700); err != nil {
		return fmt.Errorf("create work dir: %w", err)
	}
	if len(r.req.Files) > 0 {
		if err := r.keepForPreview(); err != nil { // preview.go
			return err
		}
		if err := r.replaceContent(r.req.Files); err != nil {
			return err
		}
	}
	_ = os.Remove(filepath.Join(r.stack, "plan.out")) // where older versions kept the plan
	if r.req.Variables != nil {
		if err := writeJSONAtomic(r.varsPath(), r.req.Variables); err != nil {
			return fmt.Errorf("variables: %w", err)
		}
	}
	return r.giveToSandbox()
}

// replaceContent replaces the work dir's content files (contentFiles) by files: prepare with the
// request's, a preview's end with the stored ones (preview.go). The work dir is the sandbox
// user's, so a name may be a symlink terraform planted there: each file is written atomically
// (internal/atomicfile), which replaces such a link and never writes through it.
func (r *run) replaceContent(files map[string][]byte) error {
	old, err := contentFiles(r.work)
	if err != nil {
		return err
	}
	for _, name := range old {
		if err := os.Remove(filepath.Join(r.work, name)); err != nil {
			return fmt.Errorf("remove old content: %w", err)
		}
	}
	for name, b := range files {
		if err := atomicfile.WriteFile(filepath.Join(r.work, name), b, 0o600); err != nil {
			return fmt.Errorf("write content: %w", err)
		}
	}
	return nil
}

// giveToSandbox makes the variables file and the work dir terraform's user's (without a
// sandbox, nothing): only that user can read the variables (credentials among them: 0600, its
// own), and it reads them in the next run.
func (r *run) giveToSandbox() error {
	if r.e.opts.InsecureNoSandbox {
		return nil
	}
	uid, gid := r.e.opts.SandboxUID, r.e.opts.SandboxGID
	if err := os.Lchown(r.varsPath(), uid, gid); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("variables: %w", err)
	}
	if err := chownTree(r.work, uid, gid); err != nil {
		return fmt.Errorf("work dir for uid %d: %w", uid, err)
	}
	return nil
}

// init runs `terraform init` unless the content, the CLI config, the provider mirror and the
// terraform version are what the last successful init saw. -upgrade lets init follow a provider
// rebuilt in the mirror under the same version (the lock file's checksum would refuse it).
func (r *run) init() error {
	sum, err := r.initHash()
	if err != nil {
		return err
	}
	hashFile := filepath.Join(r.stack, "init.sum")
	// (.terraform itself is no marker: a configuration with only built-in resources has none.)
	if old, err := os.ReadFile(hashFile); err == nil && string(old) == sum {
		r.log.Debug("terraform init skipped: nothing changed")
		return nil
	}
	_ = os.Remove(hashFile)
	r.setPhase("init")
	if r.e.initJSON {
		err = r.terraformJSON("init", nil, func(ctx context.Context, tf *tfexec.Terraform, w io.Writer) error {
			return tf.InitJSON(ctx, w, tfexec.Upgrade(true))
		})
	} else {
		// Before Terraform 1.9 init has no -json: its diagnostics are parsed from stderr alone,
		// so that progress lines on stdout cannot end up inside one.
		stdout := &lineWriter{fn: func(line []byte) { r.textLine(line, false) }}
		stderr := &lineWriter{fn: func(line []byte) { r.textLine(line, true) }}
		r.touch()
		err = r.e.tf.run(r.ctx, r.kill, r.command(nil, touchWriter{stdout, r.touch}, touchWriter{stderr, r.touch}), "init",
			func(ctx context.Context, tf *tfexec.Terraform) error {
				return tf.Init(ctx, tfexec.Upgrade(true))
			})
		stdout.flush()
		stderr.flush()
		if err != nil {
			r.mu.Lock()
			for _, d := range parseTextDiagnostics(r.textOut.String()) {
				r.diags = append(r.diags, r.e.explainDiagnostic(d))
			}
			r.mu.Unlock()
		}
	}
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(hashFile, []byte(sum), 0o600)
}

var mirrorPathRe = regexp.MustCompile(`(?m)^\s*path\s*=\s*"([^"]+)"`)

func (r *run) initHash() (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "terraform %s %s\n", r.e.opts.TerraformPath, r.e.tfVersion)
	cfg, err := os.ReadFile(r.e.opts.CLIConfigFile)
	if err != nil {
		return "", fmt.Errorf("read cli config: %w", err)
	}
	h.Write(cfg)
	// The provider binaries in the filesystem mirrors the config names: size and mtime are
	// enough to notice a rebuilt provider.
	for _, m := range mirrorPathRe.FindAllStringSubmatch(string(cfg), -1) {
		_ = filepath.WalkDir(m[1], func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return nil
			}
			if info, err := os.Stat(p); err == nil {
				fmt.Fprintf(h, "%s %d %d\n", p, info.Size(), info.ModTime().UnixNano())
			}
			return nil
		})
	}
	names, err := contentFiles(r.work)
	if err != nil {
		return "", err
	}
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(r.work, n))
		if err != nil {
			return "", fmt.Errorf("read content: %w", err)
		}
		fmt.Fprintf(h, "%s %d\n", n, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// command is a terraform command in the run's work dir.
func (r *run) command(readOnly []string, stdout, stderr io.Writer) command {
	return command{dir: r.work, work: true, readOnly: readOnly, stdout: stdout, stderr: stderr}
}

// terraformJSON runs a terraform command whose -json UI stream fn writes to w, and feeds that
// stream to the job.
func (r *run) terraformJSON(name string, readOnly []string, fn func(context.Context, *tfexec.Terraform, io.Writer) error) error {
	r.setPhase(name)
	stdout := &lineWriter{fn: r.uiLine}
	stderr := &lineWriter{fn: r.stderrLine}
	r.touch()
	w := touchWriter{stdout, r.touch}
	err := r.e.tf.run(r.ctx, r.kill, r.command(readOnly, nil, touchWriter{stderr, r.touch}), name,
		func(ctx context.Context, tf *tfexec.Terraform) error { return fn(ctx, tf, w) })
	stdout.flush()
	stderr.flush()
	return err
}

// show runs `terraform show -json` of the state (file == "") or of a saved plan and returns the
// raw JSON with the decoded value. It runs after the operation, also after a cancel, so it uses
// the kill context only (bounded by HangTimeout).
func (r *run) show(file string) (raw []byte, state *tfjson.State, plan *tfjson.Plan, err error) {
	ctx, cancel := context.WithTimeout(r.kill, r.e.opts.HangTimeout)
	defer cancel()
	var out bytes.Buffer
	stderr := &lineWriter{fn: r.stderrLine}
	r.touch()
	err = r.e.tf.run(ctx, ctx, r.command(nil, touchWriter{&out, r.touch}, touchWriter{stderr, r.touch}), "show",
		func(ctx context.Context, tf *tfexec.Terraform) error {
			var err error
			if file == "" {
				state, err = tf.Show(ctx, tfexec.JSONNumber(false))
			} else {
				plan, err = tf.ShowPlanFile(ctx, file, tfexec.JSONNumber(false))
			}
			return err
		})
	stderr.flush()
	if err != nil {
		return nil, nil, nil, err
	}
	return out.Bytes(), state, plan, nil
}

// state reads the work dir's state as `terraform show -json` prints it: from the state file
// itself (statefile.go: show would start every provider again for its schema), else with show.
func (r *run) state() ([]byte, *tfjson.State, error) {
	raw, err := readStateFile(filepath.Join(r.work, "terraform.tfstate"), r.e.stateOwner())
	if err == nil {
		st := &tfjson.State{}
		if err = json.Unmarshal(raw, st); err == nil {
			return raw, st, nil
		}
		err = fmt.Errorf("decode the state file's show JSON: %w", err)
	}
	r.log.Info("state file not read directly: terraform show", "err", err)
	raw, st, _, err := r.show("")
	return raw, st, err
}

// result reads what the run produced: the saved plan for plan, the state for apply and destroy
// (also after they failed, since Terraform writes the state in any case). For apply and destroy it
// also refreshes the stack's state.json snapshot.
func (r *run) result(opErr error) *Result {
	if r.kill.Err() != nil {
		return nil
	}
	switch r.req.Op {
	case OpPlan:
		if opErr != nil {
			return nil
		}
		_, _, plan, err := r.show(r.planPath())
		if err != nil {
			r.log.Warn("read plan", "err", err)
			return nil
		}
		res := &Result{Changes: planChanges(plan)}
		r.mu.Lock()
		if s := r.planSummary; s != nil {
			res.Summary = ChangeSummary{Add: s.Add, Change: s.Change, Remove: s.Remove, Import: s.Import}
		}
		r.mu.Unlock()
		return res
	default:
		r.mu.Lock()
		started := r.opStarted
		r.mu.Unlock()
		if !started {
			return nil // init failed or was cancelled: the state did not change
		}
		if _, err := os.Stat(filepath.Join(r.work, "terraform.tfstate")); err != nil {
			return nil // the operation never got to write a state
		}
		raw, st, err := r.state()
		if err != nil {
			r.log.Warn("read state", "err", err)
			return nil
		}
		if err := atomicfile.WriteFile(filepath.Join(r.stack, "state.json"), raw, 0o600); err != nil {
			r.log.Warn("write state snapshot", "err", err)
		}
		res := stateResult(st)
		r.mu.Lock()
		if s := r.finalSummary; s != nil {
			res.Summary = ChangeSummary{Add: s.Add, Change: s.Change, Remove: s.Remove, Import: s.Import}
		}
		r.mu.Unlock()
		return res
	}
}

func planChanges(p *tfjson.Plan) []ResourceChange {
	configured := map[string][]string{} // root module resource address → what it sets
	if p.Config != nil && p.Config.RootModule != nil {
		for _, cr := range p.Config.RootModule.Resources {
			configured[cr.Address] = slices.Sorted(maps.Keys(cr.Expressions))
		}
	}
	var out []ResourceChange
	for _, rc := range p.ResourceChanges {
		if rc.Change == nil || rc.Change.Actions.NoOp() {
			continue
		}
		acts := make([]string, len(rc.Change.Actions))
		for i, a := range rc.Change.Actions {
			acts[i] = string(a)
		}
		out = append(out, ResourceChange{
			Address:      rc.Address,
			Module:       rc.ModuleAddress,
			Mode:         string(rc.Mode),
			Type:         rc.Type,
			Name:         rc.Name,
			Index:        rc.Index,
			Provider:     rc.ProviderName,
			Actions:      acts,
			After:        rc.Change.After,
			AfterUnknown: rc.Change.AfterUnknown,
			Configured:   configuredOf(configured, rc),
		})
	}
	return out
}

// configuredOf is what the root module's configuration sets for rc (nil for a module's).
func configuredOf(configured map[string][]string, rc *tfjson.ResourceChange) []string {
	if rc.ModuleAddress != "" {
		return nil
	}
	addr := rc.Type + "." + rc.Name
	if rc.Mode == tfjson.DataResourceMode {
		addr = "data." + addr
	}
	return configured[addr]
}

func stateResult(st *tfjson.State) *Result {
	res := &Result{Outputs: map[string]Output{}}
	if st.Values == nil {
		return res
	}
	for name, o := range st.Values.Outputs {
		res.Outputs[name] = Output{Value: o.Value, Sensitive: o.Sensitive}
	}
	var walk func(m *tfjson.StateModule)
	walk = func(m *tfjson.StateModule) {
		if m == nil {
			return
		}
		for _, sr := range m.Resources {
			res.Resources = append(res.Resources, StateResource{
				Address:  sr.Address,
				Module:   m.Address,
				Mode:     string(sr.Mode),
				Type:     sr.Type,
				Name:     sr.Name,
				Index:    sr.Index,
				Provider: sr.ProviderName,
				Tainted:  sr.Tainted,
				Values:   sr.AttributeValues,
			})
		}
		for _, c := range m.ChildModules {
			walk(c)
		}
	}
	walk(st.Values.RootModule)
	sort.SliceStable(res.Resources, func(i, j int) bool { return res.Resources[i].Address < res.Resources[j].Address })
	return res
}

// finish decides the final status and persists the job.
func (r *run) finish(opErr error, result *Result) *Job {
	r.mu.Lock()
	defer r.mu.Unlock()
	j := r.job
	now := time.Now().UTC()
	var cause *cancelCause
	if r.ctx.Err() != nil {
		errors.As(context.Cause(r.ctx), &cause)
	}
	diags := errorDiagnostics(r.diags)
	switch {
	case cause != nil && (opErr != nil || r.req.Op == OpPlan):
		// terraform plan exits 0 when it is interrupted, without writing a plan: a plan the run
		// was cancelled during is the cancel's, whatever terraform said.
		j.Status = cause.status
		j.Error = &JobError{Kind: cause.kind, Message: cause.msg, Diagnostics: diags}
	case opErr == nil && r.req.Op == OpPlan && result == nil:
		j.Status = StatusFailed
		j.Error = &JobError{Kind: KindInternal, Message: "terraform plan exited 0 but its plan could not be read", Diagnostics: diags}
	case opErr == nil:
		j.Status = StatusSucceeded
		j.Percent = 100
	default:
		j.Status = StatusFailed
		j.Error = r.terraformError(opErr, diags)
	}
	j.Result = result
	j.FinishedAt, j.UpdatedAt = now, now
	final := cloneJob(j)
	// Observers hear of the final job under r.mu, before a get or a watch can see it end, so
	// whoever saw it end also sees it counted (terraformer's metrics).
	if r.e.opts.OnFinish != nil {
		r.e.opts.OnFinish(final)
	}
	r.persistLocked()
	return final
}

func (r *run) terraformError(opErr error, diags []Diagnostic) *JobError {
	var exit *exec.ExitError
	if !errors.As(opErr, &exit) {
		return &JobError{Kind: KindInternal, Message: opErr.Error()}
	}
	op := "terraform " + r.phase
	if len(diags) > 0 {
		parts := make([]string, len(diags))
		for i, d := range diags {
			parts[i] = d.String()
		}
		return &JobError{Kind: KindTerraform, Message: op + ": " + strings.Join(parts, "; "), Diagnostics: diags}
	}
	msg := op + ": " + exit.String()
	if len(r.stderr) > 0 {
		msg += ": " + strings.Join(r.stderr, " ")
	}
	return &JobError{Kind: KindTerraform, Message: msg}
}

// textLine takes a line of human-readable output (init).
func (r *run) textLine(line []byte, stderr bool) {
	r.writeRaw(line)
	r.mu.Lock()
	defer r.mu.Unlock()
	if stderr {
		r.textOut.Write(line)
		r.textOut.WriteByte('\n')
	}
	if s := strings.TrimSpace(string(line)); s != "" {
		r.addLogLocked(s)
	}
}

func (r *run) stderrLine(line []byte) {
	r.writeRaw(line)
	s := strings.TrimSpace(string(line))
	if s == "" {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stderr = append(r.stderr, s)
	if len(r.stderr) > stderrTail {
		r.stderr = r.stderr[len(r.stderr)-stderrTail:]
	}
	r.addLogLocked(s)
}

// uiLine takes a line of Terraform's -json UI stream.
func (r *run) uiLine(line []byte) {
	r.writeRaw(line)
	var m uiMessage
	if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &m) != nil {
		if s := strings.TrimSpace(string(line)); s != "" {
			r.mu.Lock()
			r.addLogLocked(s)
			r.mu.Unlock()
		}
		return
	}
	if lockFileNoise(&m) {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	j := r.job
	var res *ResourceProgress
	hookRes := func() *ResourceProgress {
		if m.Hook == nil {
			return nil
		}
		p := r.resourceLocked(m.Hook.Resource)
		p.Message = m.Message
		if m.Hook.Elapsed > 0 {
			p.Elapsed = int(m.Hook.Elapsed)
		}
		return p
	}
	switch m.Type {
	case "planned_change":
		if m.Change != nil {
			res = r.resourceLocked(m.Change.Resource)
			res.Action = m.Change.Action
			res.Status = ResourcePlanned
			res.Message = m.Message
		}
	case "change_summary":
		if m.Changes != nil {
			s := *m.Changes
			if s.Operation == "plan" && r.planSummary == nil {
				r.planSummary = &s
				j.Planned = s.Add + s.Change + s.Remove
			} else {
				r.finalSummary = &s
			}
		}
	case "apply_start":
		if res = hookRes(); res != nil {
			res.Action = m.Hook.Action
			res.Status = ResourceApplying
		}
	case "apply_progress":
		res = hookRes()
	case "apply_complete":
		if res = hookRes(); res != nil {
			res.Status = ResourceComplete
			res.IDValue = m.Hook.IDValue
			j.Completed++
		}
	case "apply_errored":
		if res = hookRes(); res != nil {
			res.Status = ResourceErrored
			j.Completed++
		}
	case "provision_start", "provision_complete", "provision_errored":
		if res = hookRes(); res != nil {
			res.Provisioner = m.Hook.Provisioner + " " + strings.TrimPrefix(m.Type, "provision_")
		}
	case "diagnostic":
		if m.Diagnostic != nil {
			d := r.e.explainDiagnostic(diagnosticFromJSON(m.Diagnostic))
			r.diags = append(r.diags, d)
			r.publishLocked(Event{Type: EventDiagnostic, Diagnostic: &d})
		}
	}
	if j.Planned > 0 {
		j.Percent = min(j.Completed*100/j.Planned, 99)
	}
	if res != nil {
		c := *res
		r.publishLocked(Event{Type: EventProgress, Resource: &c})
	}
	if msg := strings.TrimSpace(m.Message); msg != "" {
		r.addLogLocked(msg)
	}
	j.UpdatedAt = time.Now().UTC()
	r.dirty = true
	if time.Since(r.lastPersist) >= persistEvery {
		r.persistLocked()
	}
}

// lockFileWarning is the summary of the warning `terraform init` gives for every provider it
// installs from a filesystem mirror: it could record the checksums of this platform's package
// only, so the lock file would fail on another platform. Kloud's lock files never leave the work
// dir, and no lock file can be "complete" from a mirror of one platform (Terraform warns unless
// the prior lock has other checksums than the ones it computed, which only a registry's signed
// list gives): the warning is noise in every job's log.
const lockFileWarning = "Incomplete lock file information for providers"

// lockFileNoise reports whether m is that warning (the raw log keeps it).
func lockFileNoise(m *uiMessage) bool {
	return m.Type == "diagnostic" && m.Diagnostic != nil && m.Diagnostic.Severity == tfjson.DiagnosticSeverityWarning &&
		m.Diagnostic.Summary == lockFileWarning
}

func (r *run) resourceLocked(u uiResource) *ResourceProgress {
	i, ok := r.resIndex[u.Addr]
	if !ok {
		i = len(r.job.Resources)
		r.resIndex[u.Addr] = i
		r.job.Resources = append(r.job.Resources, ResourceProgress{
			Address:  u.Addr,
			Module:   u.Module,
			Type:     u.ResourceType,
			Name:     u.ResourceName,
			Index:    u.ResourceKey,
			Provider: u.ImpliedProvider,
		})
	}
	return &r.job.Resources[i]
}

func (r *run) addLogLocked(s string) {
	for _, line := range strings.Split(s, "\n") {
		line = strings.TrimRight(line, " ")
		if line == "" {
			continue
		}
		r.job.Log = append(r.job.Log, line)
		if len(r.job.Log) > logTailLines {
			r.job.Log = r.job.Log[len(r.job.Log)-logTailLines:]
		}
		r.publishLocked(Event{Type: EventLog, Line: line})
	}
}

// writeRaw appends a raw output line to the job's log file.
func (r *run) writeRaw(line []byte) {
	if r.logFile == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.logFile.Write(append(append([]byte(nil), line...), '\n')) //nolint:errcheck // best effort
}

func (r *run) persist() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.writeJobLocked()
}

func (r *run) persistLocked() {
	if err := r.writeJobLocked(); err != nil {
		r.log.Warn("persist job", "err", err)
	}
}

func (r *run) writeJobLocked() error {
	r.dirty = false
	r.lastPersist = time.Now()
	return writeJSONAtomic(r.e.jobPath(r.id), r.job)
}

// publishLocked fills in the common fields and queues the event for every watcher.
func (r *run) publishLocked(ev Event) {
	ev.JobID = r.id
	ev.Time = time.Now().UTC()
	ev.Status = r.job.Status
	ev.Percent = r.job.Percent
	for w := range r.watchers {
		w.push(ev, func() Event {
			return Event{Type: EventJob, JobID: r.id, Time: ev.Time, Status: r.job.Status, Percent: r.job.Percent, Job: cloneJob(r.job)}
		})
	}
}

// watcher queues events for one Watch call, so that a slow reader never blocks the run.
type watcher struct {
	mu     sync.Mutex
	queue  []Event
	notify chan struct{}
}

func (w *watcher) push(ev Event, snapshot func() Event) {
	w.mu.Lock()
	if len(w.queue) >= watchQueueMax && ev.Type != EventFinal {
		// The reader is far behind: replace what it missed by the current state.
		w.queue = append(w.queue[:0], snapshot())
	} else {
		w.queue = append(w.queue, ev)
	}
	w.mu.Unlock()
	select {
	case w.notify <- struct{}{}:
	default:
	}
}

func (r *run) watch(ctx context.Context) <-chan Event {
	ch := make(chan Event, 16)
	r.mu.Lock()
	snap := cloneJob(r.job)
	if snap.Status.Final() {
		r.mu.Unlock()
		ch <- finalEvent(snap)
		close(ch)
		return ch
	}
	w := &watcher{
		notify: make(chan struct{}, 1),
		queue:  []Event{{Type: EventJob, JobID: r.id, Time: time.Now().UTC(), Status: snap.Status, Percent: snap.Percent, Job: snap}},
	}
	r.watchers[w] = struct{}{}
	r.mu.Unlock()
	go func() {
		defer close(ch)
		defer func() {
			r.mu.Lock()
			delete(r.watchers, w)
			r.mu.Unlock()
		}()
		for {
			w.mu.Lock()
			q := w.queue
			w.queue = nil
			w.mu.Unlock()
			for _, ev := range q {
				select {
				case ch <- ev:
				case <-ctx.Done():
					return
				}
				if ev.Type == EventFinal {
					return
				}
			}
			select {
			case <-w.notify:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch
}

var _ io.Writer = (*lineWriter)(nil)
