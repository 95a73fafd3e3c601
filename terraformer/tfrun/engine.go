package tfrun

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	version "github.com/hashicorp/go-version"
	"github.com/hashicorp/terraform-exec/tfexec"
	tfjson "github.com/hashicorp/terraform-json"

	"github.com/kloud-dev/kloud/internal/atomicfile"
	"github.com/kloud-dev/kloud/internal/cgroups"
	"github.com/kloud-dev/kloud/terraformer/tfsandbox"
)

// Options configure an Engine. Zero fields get the defaults in their comments.
type Options struct {
	// Dir is the root for working directories, state, leases and jobs.
	// Default: ~/.kloud/terraformer.
	Dir string
	// TerraformPath is the terraform binary (1.1 or later). Default: "terraform" on PATH, else
	// $KLOUD_CACHE/bin/terraform (KLOUD_CACHE defaults to /var/cache/kloud).
	TerraformPath string
	// CLIConfigFile becomes TF_CLI_CONFIG_FILE; it should install providers from a filesystem
	// mirror so that `terraform init` needs no network (scripts/tf-mirror.sh writes one).
	// Default: $KLOUD_CACHE/terraform.tfrc if it exists; New fails without one.
	CLIConfigFile string
	// Owner identifies this engine in leases and jobs. Default: hostname:pid:random.
	Owner string
	// LeaseTTL is how long a lease lives without renewal; a running job renews it every
	// LeaseTTL/3. A crashed engine's leases are free after at most LeaseTTL. Default: 30s.
	LeaseTTL time.Duration
	// HangTimeout: a job whose terraform prints nothing (no event, no log line) for this long is
	// marked hung and cancelled. Terraform reports a resource that is still being created every
	// 10s, so a slow resource is not a hang; a provider or plugin that stops answering is.
	// Default: 10m.
	HangTimeout time.Duration
	// CancelGrace is the time between SIGINT and SIGKILL when a job is cancelled. Default: 10s.
	CancelGrace time.Duration
	// Logger receives the engine's logs. Default: discard.
	Logger *slog.Logger

	// Launcher is the program terraform-exec runs in terraform's place (see package
	// terraformer/tfsandbox): it must call tfsandbox.MaybeRun first in main. Default: this
	// program (os.Executable), which then must have called tfsandbox.MaybeRun.
	Launcher string
	// SandboxUID and SandboxGID are the user and group terraform runs as. Default: 65534
	// (nobody, nogroup); 0 means the default, terraform never runs as root in the sandbox.
	SandboxUID, SandboxGID int
	// SandboxReadOnly are extra host paths terraform may read (bound read-only at their own
	// paths), e.g. a CA bundle outside /etc. The CLI config file, the provider mirrors and
	// plugin cache it names, and the terraform binary are always there.
	SandboxReadOnly []string
	// InsecureNoSandbox runs terraform without the sandbox: as this process's user, seeing the
	// whole host, its processes not confined to a pid namespace. Only for development without
	// root; without it, New fails unless the sandbox can be built (root).
	InsecureNoSandbox bool
	// SandboxLimits, if set, run every terraform command (terraform, its providers and what they
	// start) in a cgroup of its own with these cpu, memory and pids limits (tfsandbox.Config.
	// Limits); a cgroup a killed command left is removed after it and at New. Nil: no cgroup.
	// terraformer serve sets tfsandbox.DefaultTerraformLimits unless told otherwise.
	SandboxLimits *cgroups.Limits
	// OnFinish, if set, is called with each job this engine ran once it is final and before its
	// final event reaches any watcher (terraformer's metrics). It must not block.
	OnFinish func(j *Job)
}

// Engine runs Terraform jobs. Its methods are safe for concurrent use.
type Engine struct {
	opts      Options
	log       *slog.Logger
	tf        *terraform
	tfVersion string
	initJSON  bool     // terraform has `init -json` (1.9 and later)
	mirrors   []string // the provider mirrors (and plugin cache) the CLI config names
	host      string
	jobsDir   string
	stacksDir string
	poolID    string // Dir's pool id (PoolID)

	mu        sync.Mutex
	closed    bool
	active    map[string]*run // by job id
	byContent map[string]*run // by content id
	wg        sync.WaitGroup
}

const minTerraformVersion = "1.1.0"

// New prepares an Engine: it fills in defaults, checks the terraform binary, creates Dir, and marks
// jobs that a previous process left queued or running, and whose process is gone, as failed
// ("terraformer restarted"). Their leases are left to expire.
func New(ctx context.Context, opts Options) (*Engine, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	host, _ := os.Hostname()
	if opts.Dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return nil, fmt.Errorf("default dir: %w", err)
		}
		opts.Dir = filepath.Join(home, ".kloud", "terraformer")
	}
	cache := os.Getenv("KLOUD_CACHE")
	if cache == "" {
		cache = "/var/cache/kloud"
	}
	if opts.TerraformPath == "" {
		p, err := exec.LookPath("terraform")
		if err != nil {
			p = filepath.Join(cache, "bin", "terraform")
			if _, serr := os.Stat(p); serr != nil {
				return nil, fmt.Errorf("no terraform on PATH nor at %s (run scripts/tf-mirror.sh): %w", p, err)
			}
		}
		opts.TerraformPath = p
	}
	if opts.CLIConfigFile == "" {
		p := filepath.Join(cache, "terraform.tfrc")
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("no CLIConfigFile and none at %s (run scripts/tf-mirror.sh): %w", p, err)
		}
		opts.CLIConfigFile = p
	}
	if opts.Owner == "" {
		opts.Owner = fmt.Sprintf("%s:%d:%s", host, os.Getpid(), randomHex(4))
	}
	if opts.LeaseTTL <= 0 {
		opts.LeaseTTL = 30 * time.Second
	}
	if opts.HangTimeout <= 0 {
		opts.HangTimeout = 10 * time.Minute
	}
	if opts.CancelGrace <= 0 {
		opts.CancelGrace = 10 * time.Second
	}
	if opts.SandboxUID <= 0 {
		opts.SandboxUID = tfsandbox.DefaultUID
	}
	if opts.SandboxGID <= 0 {
		opts.SandboxGID = tfsandbox.DefaultGID
	}
	if !opts.InsecureNoSandbox {
		if err := tfsandbox.Check(); err != nil {
			return nil, fmt.Errorf("%w: run terraformer as root (InsecureNoSandbox, terraformer's --insecure-no-sandbox, runs terraform without it: for development only)", err)
		}
	}
	if opts.SandboxLimits != nil && !opts.InsecureNoSandbox {
		removed, err := tfsandbox.RemoveLeftovers(tfsandbox.CgroupPrefixTerraform)
		if len(removed) > 0 || err != nil {
			opts.Logger.Info("removed terraform cgroups killed runs left", "cgroups", removed, "err", err)
		}
	}
	if opts.Launcher == "" {
		if !tfsandbox.Installed() {
			return nil, fmt.Errorf("no Launcher, and this program is none: its main (or TestMain) must call tfsandbox.MaybeRun() first: %w", ErrInvalid)
		}
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("launcher: %w", err)
		}
		opts.Launcher = exe
	}
	var err error
	if opts.Dir, err = filepath.Abs(opts.Dir); err != nil {
		return nil, fmt.Errorf("dir: %w", err)
	}
	if opts.CLIConfigFile, err = filepath.Abs(opts.CLIConfigFile); err != nil {
		return nil, fmt.Errorf("cli config: %w", err)
	}
	if opts.TerraformPath, err = filepath.Abs(opts.TerraformPath); err != nil {
		return nil, fmt.Errorf("terraform: %w", err)
	}
	readOnly := []string{opts.CLIConfigFile}
	mirrors, err := tfsandbox.CLIConfigPaths(opts.CLIConfigFile)
	if err != nil {
		return nil, err
	}
	readOnly = append(append(readOnly, mirrors...), opts.SandboxReadOnly...)
	e := &Engine{
		opts:      opts,
		log:       opts.Logger,
		mirrors:   mirrors,
		host:      host,
		jobsDir:   filepath.Join(opts.Dir, "jobs"),
		stacksDir: filepath.Join(opts.Dir, "stacks"),
		active:    map[string]*run{},
		byContent: map[string]*run{},
	}
	e.tf = &terraform{
		launcher: opts.Launcher,
		sandbox: tfsandbox.Config{
			Program:  opts.TerraformPath,
			ReadOnly: readOnly,
			UID:      opts.SandboxUID,
			GID:      opts.SandboxGID,
			Insecure: opts.InsecureNoSandbox,
			Limits:   opts.SandboxLimits,
		},
		env:    terraformEnv(opts.CLIConfigFile, opts.InsecureNoSandbox),
		grace:  opts.CancelGrace,
		logger: opts.Logger,
	}
	for _, d := range []string{e.jobsDir, e.stacksDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("create %s: %w", d, err)
		}
	}
	if e.poolID, err = loadPoolID(filepath.Join(opts.Dir, "pool-id")); err != nil {
		return nil, err
	}
	if e.tfVersion, err = e.terraformVersion(ctx); err != nil {
		return nil, err
	}
	e.log.Info("terraformer engine ready", "dir", opts.Dir, "terraform", opts.TerraformPath,
		"terraform_version", e.tfVersion, "owner", opts.Owner, "sandbox", !opts.InsecureNoSandbox,
		"sandbox_uid", opts.SandboxUID, "sandbox_gid", opts.SandboxGID)
	if err := e.reapJobs(); err != nil {
		return nil, err
	}
	return e, nil
}

func (e *Engine) terraformVersion(ctx context.Context) (string, error) {
	var errOut bytes.Buffer
	var got *version.Version
	err := e.tf.run(ctx, ctx, command{dir: e.opts.Dir, stderr: &errOut}, "version", func(ctx context.Context, tf *tfexec.Terraform) error {
		var err error
		got, _, err = tf.Version(ctx, true)
		return err
	})
	if err != nil {
		return "", fmt.Errorf("terraform version (through the sandbox launcher %s): %w: %s", e.opts.Launcher, err, strings.TrimSpace(errOut.String()))
	}
	if got.LessThan(version.Must(version.NewVersion(minTerraformVersion))) {
		return "", fmt.Errorf("terraform %s at %s is older than %s: %w", got, e.opts.TerraformPath,
			minTerraformVersion, ErrInvalid)
	}
	e.initJSON = !got.LessThan(version.Must(version.NewVersion("1.9.0")))
	return got.String(), nil
}

// Version returns the version of the terraform binary the engine runs.
func (e *Engine) Version() string { return e.tfVersion }

// Running is how many jobs this engine runs now.
func (e *Engine) Running() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.active)
}

// Options returns the options in force, defaults filled in.
func (e *Engine) Options() Options { return e.opts }

// PoolID is the random id of Dir, made by the first engine that used it (Dir/pool-id). Engines
// of several processes that share one Dir (a pool of terraformers, Options.Dir) report the same
// id: kloud's pool (terraformer/tfpool) refuses a member whose id differs, since a job it ran,
// its state and its files would be on a disk the others do not see.
func (e *Engine) PoolID() string { return e.poolID }

// loadPoolID reads path, or creates it with a new id (O_EXCL: of engines starting at once on
// one Dir, one writes it and the others read it).
func loadPoolID(path string) (string, error) {
	for range 50 {
		b, err := os.ReadFile(path)
		if id := strings.TrimSpace(string(b)); err == nil && jobIDRe.MatchString(id) {
			return id, nil
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("pool id: %w", err)
		}
		if err == nil {
			// Being written by another engine (it writes before it closes), or damaged.
			if fi, serr := os.Stat(path); serr == nil && time.Since(fi.ModTime()) > 5*time.Second {
				return "", fmt.Errorf("pool id: %s holds no id; remove it to make a new one", path)
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		if err != nil {
			return "", fmt.Errorf("pool id: %w", err)
		}
		id := newJobID()
		_, werr := f.WriteString(id + "\n")
		if cerr := f.Close(); werr == nil {
			werr = cerr
		}
		if werr != nil {
			return "", fmt.Errorf("pool id: %w", werr)
		}
		return id, nil
	}
	return "", fmt.Errorf("pool id: %s stays empty", path)
}

var contentIDRe = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]{0,199}$`)

func checkContentID(id string) error {
	if !contentIDRe.MatchString(id) {
		return fmt.Errorf("content id %q: %w", id, ErrInvalid)
	}
	return nil
}

func checkFileName(name string) error {
	if name == "" || name != filepath.Base(name) || strings.HasPrefix(name, ".") ||
		!(strings.HasSuffix(name, ".tf") || strings.HasSuffix(name, ".tf.json")) || len(name) > 255 {
		return fmt.Errorf("file name %q (want a plain name ending in .tf or .tf.json): %w", name, ErrInvalid)
	}
	return nil
}

// Submit starts a job and returns it at once (queued or running); the job runs on after ctx is
// done, and after the caller has gone away. It fails with ErrLocked when another job holds the
// content id's lease (in this or another process), with ErrNotFound when Files is empty and
// nothing is stored for the content id, and with ErrInvalid for a malformed request.
func (e *Engine) Submit(ctx context.Context, req Request) (*Job, error) {
	if !validOp(req.Op) {
		return nil, fmt.Errorf("op %q: %w", req.Op, ErrInvalid)
	}
	if err := checkContentID(req.ContentID); err != nil {
		return nil, err
	}
	if req.Preview && (req.Op != OpPlan || len(req.Files) == 0) {
		return nil, fmt.Errorf("preview is a plan of files (op %q, %d files): %w", req.Op, len(req.Files), ErrInvalid)
	}
	for name := range req.Files {
		if err := checkFileName(name); err != nil {
			return nil, err
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, ErrClosed
	}
	if r := e.byContent[req.ContentID]; r != nil {
		return nil, fmt.Errorf("content %q: job %s is running: %w", req.ContentID, r.id, ErrLocked)
	}
	stack := e.stackDir(req.ContentID)
	if err := os.MkdirAll(filepath.Join(stack, "work"), 0o700); err != nil {
		return nil, fmt.Errorf("create stack dir: %w", err)
	}
	id := newJobID()
	lf := leaseFile{dir: stack}
	if err := lf.acquire(e.opts.Owner, id, e.opts.LeaseTTL); err != nil {
		return nil, fmt.Errorf("content %q: %w", req.ContentID, err)
	}
	if len(req.Files) == 0 {
		has, err := hasContent(filepath.Join(stack, "work"))
		if err == nil && !has {
			err = fmt.Errorf("content %q: no files given and none stored: %w", req.ContentID, ErrNotFound)
		}
		if err != nil {
			_ = lf.release(e.opts.Owner, id)
			return nil, err
		}
	}
	now := time.Now().UTC()
	job := &Job{
		ID:        id,
		ContentID: req.ContentID,
		Op:        req.Op,
		TraceID:   req.TraceID,
		Status:    StatusQueued,
		Owner:     e.opts.Owner,
		Host:      e.host,
		PID:       os.Getpid(),
		CreatedAt: now,
		UpdatedAt: now,
	}
	r := newRun(e, req, job, lf)
	if err := r.persist(); err != nil {
		_ = lf.release(e.opts.Owner, id)
		return nil, err
	}
	e.active[id] = r
	e.byContent[req.ContentID] = r
	ret := cloneJob(job) // before the run goroutine owns job
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		r.execute() // removes r from active and byContent when the job is final
	}()
	e.log.Info("job submitted", "job_id", id, "content_id", req.ContentID, "op", req.Op, "trace_id", req.TraceID)
	return ret, nil
}

// Job returns the job with this id, from memory while it runs, from disk after it finished (also
// after a restart). A job that a vanished process left unfinished is marked failed on the way.
func (e *Engine) Job(id string) (*Job, error) {
	if r := e.activeRun(id); r != nil {
		return r.snapshot(), nil
	}
	job, err := e.loadJob(id)
	if err != nil {
		return nil, err
	}
	return e.reapIfDead(job), nil
}

// Watch streams the job's events: first a snapshot (EventJob; EventFinal if the job has already
// finished), then progress, log, diagnostic and status events as they happen, and finally
// EventFinal, after which the channel is closed. The channel is also closed when ctx is done. A
// watcher that does not keep up gets a fresh EventJob snapshot in place of the events it missed;
// the final event is never dropped. For a job running in another process, Watch polls the job
// file and sends a snapshot whenever it changes.
func (e *Engine) Watch(ctx context.Context, id string) (<-chan Event, error) {
	if r := e.activeRun(id); r != nil {
		return r.watch(ctx), nil
	}
	job, err := e.Job(id)
	if err != nil {
		return nil, err
	}
	ch := make(chan Event, 1)
	if job.Status.Final() {
		ch <- finalEvent(job)
		close(ch)
		return ch, nil
	}
	go e.pollJob(ctx, job, ch)
	return ch, nil
}

func (e *Engine) pollJob(ctx context.Context, job *Job, ch chan<- Event) {
	defer close(ch)
	last := job.UpdatedAt
	select {
	case ch <- Event{Type: EventJob, JobID: job.ID, Time: time.Now().UTC(), Status: job.Status, Percent: job.Percent, Job: job}:
	case <-ctx.Done():
		return
	}
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		j, err := e.Job(job.ID)
		if err != nil {
			return
		}
		if !j.Status.Final() && j.UpdatedAt.Equal(last) {
			continue
		}
		last = j.UpdatedAt
		ev := Event{Type: EventJob, JobID: j.ID, Time: time.Now().UTC(), Status: j.Status, Percent: j.Percent, Job: j}
		if j.Status.Final() {
			ev = finalEvent(j)
		}
		select {
		case ch <- ev:
		case <-ctx.Done():
			return
		}
		if j.Status.Final() {
			return
		}
	}
}

func finalEvent(j *Job) Event {
	return Event{Type: EventFinal, JobID: j.ID, Time: time.Now().UTC(), Status: j.Status, Percent: j.Percent, Job: j}
}

// Cancel stops a running job: SIGINT to terraform, which stops its providers and writes the state,
// then SIGKILL to its process group after CancelGrace. It waits until the job has finished or ctx
// is done; in the latter case the cancellation goes on and Cancel returns ctx's error. Cancelling a
// finished job is ErrState; a job running in another process cannot be cancelled from here
// (ErrState too).
func (e *Engine) Cancel(ctx context.Context, id string) error {
	r := e.activeRun(id)
	if r == nil {
		job, err := e.Job(id)
		if err != nil {
			return err
		}
		if job.Status.Final() {
			return fmt.Errorf("job %s is %s: %w", id, job.Status, ErrState)
		}
		return fmt.Errorf("job %s runs in another terraformer (%s): %w", id, job.Owner, ErrState)
	}
	r.stop(&cancelCause{kind: KindCancelled, status: StatusCancelled, msg: "cancelled"})
	select {
	case <-r.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("cancel job %s: %w", id, ctx.Err())
	}
}

// State returns the content id's Terraform state (`terraform show -json`) as of the end of the
// last run. While no run holds the content id and the state file is newer than that snapshot (a
// process died mid-run), the snapshot is refreshed first. ErrNotFound if nothing ran yet.
func (e *Engine) State(ctx context.Context, contentID string) (*tfjson.State, error) {
	if err := checkContentID(contentID); err != nil {
		return nil, err
	}
	stack := e.stackDir(contentID)
	if _, err := os.Stat(stack); err != nil {
		return nil, fmt.Errorf("content %q: %w", contentID, ErrNotFound)
	}
	if err := e.refreshState(ctx, contentID); err != nil {
		e.log.Warn("state refresh", "content_id", contentID, "err", err)
	}
	b, err := os.ReadFile(filepath.Join(stack, "state.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("content %q: no state yet: %w", contentID, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("read state: %w", err)
	}
	var st tfjson.State
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("decode state: %w", err)
	}
	return &st, nil
}

// Outputs returns the root module outputs of the content id's state, name → value (sensitive
// values included).
func (e *Engine) Outputs(ctx context.Context, contentID string) (map[string]any, error) {
	st, err := e.State(ctx, contentID)
	if err != nil {
		return nil, err
	}
	out := map[string]any{}
	if st.Values != nil {
		for name, o := range st.Values.Outputs {
			out[name] = o.Value
		}
	}
	return out, nil
}

// stateOwner is the uid a state file terraformer reads itself must have: the sandbox user's
// (-1: any, without the sandbox).
func (e *Engine) stateOwner() int {
	if e.opts.InsecureNoSandbox {
		return -1
	}
	return e.opts.SandboxUID
}

// refreshState rewrites state.json from terraform.tfstate when the latter is newer and nobody
// holds the content id. It holds the lease while it does (a Submit at that moment gets ErrLocked).
func (e *Engine) refreshState(ctx context.Context, contentID string) error {
	stack := e.stackDir(contentID)
	work := filepath.Join(stack, "work")
	tfst, err := os.Stat(filepath.Join(work, "terraform.tfstate"))
	if err != nil {
		return nil
	}
	if snap, err := os.Stat(filepath.Join(stack, "state.json")); err == nil && !tfst.ModTime().After(snap.ModTime()) {
		return nil
	}
	if _, err := os.Stat(filepath.Join(stack, "init.sum")); err != nil {
		return nil // not initialised: show would fail
	}
	e.mu.Lock()
	if e.closed || e.byContent[contentID] != nil {
		e.mu.Unlock()
		return nil
	}
	id := "state-" + newJobID()
	lf := leaseFile{dir: stack}
	err = lf.acquire(e.opts.Owner, id, e.opts.LeaseTTL)
	e.mu.Unlock()
	if err != nil {
		return nil // someone runs: the snapshot will be written when they finish
	}
	defer lf.release(e.opts.Owner, id) //nolint:errcheck // expires anyway
	if !e.opts.InsecureNoSandbox {
		// A work dir of an older terraformer (which ran terraform as root) becomes the sandbox
		// user's, as a run's prepare does.
		if err := chownTree(work, e.opts.SandboxUID, e.opts.SandboxGID); err != nil {
			return fmt.Errorf("work dir for uid %d: %w", e.opts.SandboxUID, err)
		}
	}
	if raw, err := readStateFile(filepath.Join(work, "terraform.tfstate"), e.stateOwner()); err == nil {
		return atomicfile.WriteFile(filepath.Join(stack, "state.json"), raw, 0o600)
	}
	var out, errOut bytes.Buffer
	err = e.tf.run(ctx, ctx, command{dir: work, work: true, stdout: &out, stderr: &errOut}, "show",
		func(ctx context.Context, tf *tfexec.Terraform) error {
			_, err := tf.Show(ctx, tfexec.JSONNumber(false))
			return err
		})
	if err != nil {
		return fmt.Errorf("%w: %s", err, strings.TrimSpace(errOut.String()))
	}
	return atomicfile.WriteFile(filepath.Join(stack, "state.json"), out.Bytes(), 0o600)
}

// Close cancels every running job (SIGINT, then SIGKILL after CancelGrace), waits for them, and
// releases their leases. If ctx is done first, the remaining runs are killed at once (SIGKILL to
// their process groups) and Close returns ctx's error once they are gone. Submit fails with
// ErrClosed from the start of Close on.
func (e *Engine) Close(ctx context.Context) error {
	e.mu.Lock()
	e.closed = true
	runs := make([]*run, 0, len(e.active))
	for _, r := range e.active {
		runs = append(runs, r)
	}
	e.mu.Unlock()
	for _, r := range runs {
		r.stop(&cancelCause{kind: KindClosing, status: StatusCancelled, msg: "terraformer closing"})
	}
	done := make(chan struct{})
	go func() {
		e.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
	}
	for _, r := range runs {
		r.killNow()
	}
	<-done
	return fmt.Errorf("close: %w", ctx.Err())
}

func (e *Engine) activeRun(id string) *run {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.active[id]
}

func (e *Engine) stackDir(contentID string) string { return filepath.Join(e.stacksDir, contentID) }

func (e *Engine) jobPath(id string) string { return filepath.Join(e.jobsDir, id+".json") }

var jobIDRe = regexp.MustCompile(`^[0-9a-f]{24}$`)

func (e *Engine) loadJob(id string) (*Job, error) {
	if !jobIDRe.MatchString(id) {
		return nil, fmt.Errorf("job %q: %w", id, ErrNotFound)
	}
	b, err := os.ReadFile(e.jobPath(id))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("job %q: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("read job: %w", err)
	}
	var j Job
	if err := json.Unmarshal(b, &j); err != nil {
		return nil, fmt.Errorf("decode job %s: %w", id, err)
	}
	return &j, nil
}

// reapJobs marks the unfinished jobs of dead processes failed.
func (e *Engine) reapJobs() error {
	entries, err := os.ReadDir(e.jobsDir)
	if err != nil {
		return fmt.Errorf("list jobs: %w", err)
	}
	for _, ent := range entries {
		id, ok := strings.CutSuffix(ent.Name(), ".json")
		if !ok || !jobIDRe.MatchString(id) {
			continue
		}
		job, err := e.loadJob(id)
		if err != nil {
			e.log.Warn("unreadable job", "job_id", id, "err", err)
			continue
		}
		e.reapIfDead(job)
	}
	return nil
}

// reapIfDead marks an unfinished job that no live process runs as failed, persists that, and
// returns the (possibly updated) job. A job is orphaned when this engine does not run it and either
// its owner is this engine's owner (an earlier life of it), or its process on this host is gone, or
// its lease is no longer held for it.
func (e *Engine) reapIfDead(job *Job) *Job {
	if job.Status.Final() || e.activeRun(job.ID) != nil {
		return job
	}
	dead := job.Owner == e.opts.Owner || (job.Host == e.host && !pidAlive(job.PID))
	if !dead {
		l, err := leaseFile{dir: e.stackDir(job.ContentID)}.current()
		dead = err == nil && (l == nil || l.JobID != job.ID)
	}
	if !dead {
		return job
	}
	now := time.Now().UTC()
	job.Status = StatusFailed
	job.Error = &JobError{Kind: KindRestarted, Message: fmt.Sprintf(
		"terraformer restarted: the process that ran this job (owner %s, pid %d on %s) is gone", job.Owner, job.PID, job.Host)}
	job.FinishedAt, job.UpdatedAt = now, now
	if err := writeJSONAtomic(e.jobPath(job.ID), job); err != nil {
		e.log.Warn("persist reaped job", "job_id", job.ID, "err", err)
	}
	e.log.Warn("job orphaned by a dead process marked failed", "job_id", job.ID, "content_id", job.ContentID, "owner", job.Owner)
	return job
}

func pidAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

func hasContent(work string) (bool, error) {
	names, err := contentFiles(work)
	return len(names) > 0, err
}

// contentFiles lists the *.tf and *.tf.json files of a working directory, sorted.
func contentFiles(work string) ([]string, error) {
	entries, err := os.ReadDir(work)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list content: %w", err)
	}
	var names []string
	for _, ent := range entries {
		n := ent.Name()
		if ent.Type().IsRegular() && (strings.HasSuffix(n, ".tf") || strings.HasSuffix(n, ".tf.json")) {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	return names, nil
}

func newJobID() string { return randomHex(12) }

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := io.ReadFull(rand.Reader, b); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return hex.EncodeToString(b)
}
