package kloud

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/stackbuild"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/provider/tmpl"
	"github.com/kloud-dev/kloud/terraformer/tfapi"
)

// credential.bootstrap: the provider's bootstrap templates (shared infrastructure such as a
// network, once per credential and team) applied through terraformer as a durable job; the
// outputs, decoded into the provider's bootstrap type, are sealed into the credential. With
// destroy, the same content ids are destroyed.
//
// The credential's bootstrap.status is the lock: one conditional update moves it to running
// (or destroying) and only the job recorded in bootstrap.jobId changes it after that. Each
// terraformer job id is recorded before it is waited on, so a job recovered after a kloud
// restart re-attaches to the Terraform runs that went on without it (terraformer is another
// process) instead of starting them again.

// staleClaim is how long a bootstrap claim may wait for its job to be recorded before another
// call may take it over (kloud died between the two).
const staleClaim = 2 * time.Minute

func bootstrapContentID(team, credID string, i int) string {
	return fmt.Sprintf("bootstrap-%s-%s-%d", team, credID, i)
}

func (a *credentialAPI) bootstrap(ctx context.Context, c *Caller, _ *kite.Request, p *api.CredentialBootstrapParams) (api.BootstrapResult, error) {
	cr, err := a.load(ctx, c, p.CredentialID)
	if err != nil {
		return api.BootstrapResult{}, err
	}
	if err := manageCheck(c, cr, "bootstrap"); err != nil {
		return api.BootstrapResult{}, err
	}
	if _, err := a.providers.Lookup(cr.Provider); err != nil {
		return api.BootstrapResult{}, fmt.Errorf("credential %s: %s: %w", cr.ID, err.Error(), kite.ErrState)
	}
	if !p.Destroy { // what an earlier bootstrap made can always be destroyed
		if err := a.srv.capable(cr.Provider, api.MethodCredentialBootstrap, provider.CapBootstrap); err != nil {
			return api.BootstrapResult{}, err
		}
	}
	if _, err := a.srv.terraformer(); err != nil {
		return api.BootstrapResult{}, err
	}
	status := model.BootstrapRunning
	if p.Destroy {
		status = model.BootstrapDestroying
	}
	for range 3 {
		b := cr.Bootstrap
		if b == nil {
			b = &model.Bootstrap{Status: model.BootstrapNone}
		}
		switch {
		case !p.Destroy && b.Status == model.BootstrapDone:
			return api.BootstrapResult{JobID: b.JobID, Status: b.Status, AlreadyDone: true}, nil
		case p.Destroy && len(b.ContentIDs) == 0 && b.Status != model.BootstrapRunning && b.Status != model.BootstrapDestroying:
			return api.BootstrapResult{}, fmt.Errorf("credential %s has no bootstrap resources to destroy: %w", cr.ID, kite.ErrState)
		}
		var stale *model.Bootstrap
		if b.Status == model.BootstrapRunning || b.Status == model.BootstrapDestroying {
			if !a.staleBootstrap(ctx, b) {
				return api.BootstrapResult{}, fmt.Errorf("credential %s: bootstrap job %s is running; wait for it to end: %w", cr.ID, b.JobID, kite.ErrConflict)
			}
			// Its job is gone: take the claim over, exactly as it was read.
			stale = b
		}
		claimed, err := a.creds.ClaimBootstrap(ctx, cr.ID, status, p.Destroy, stale)
		if err != nil {
			return api.BootstrapResult{}, fmt.Errorf("credential %s: %w", cr.ID, err)
		}
		if claimed {
			return a.startBootstrap(ctx, c, cr, status, p.Destroy)
		}
		if cr, err = a.load(ctx, c, p.CredentialID); err != nil {
			return api.BootstrapResult{}, err
		}
	}
	return api.BootstrapResult{}, fmt.Errorf("credential %s: bootstrap state changed concurrently; try again: %w", p.CredentialID, kite.ErrConflict)
}

// staleBootstrap reports whether a running bootstrap has no live job behind it.
func (a *credentialAPI) staleBootstrap(ctx context.Context, b *model.Bootstrap) bool {
	if b.JobID == "" {
		return a.vault.Now().Sub(b.UpdatedAt) > staleClaim
	}
	j, err := a.jobs.Get(ctx, b.JobID)
	if err != nil {
		return errors.Is(err, store.ErrNotFound)
	}
	return j.Status.Done()
}

func (a *credentialAPI) startBootstrap(ctx context.Context, c *Caller, cr *model.Credential, status string, destroy bool) (api.BootstrapResult, error) {
	spec, err := bootstrapJob.spec(bootstrapParams{Credential: cr.ID, Destroy: destroy})
	jobID := ""
	if err == nil {
		jobID, err = a.srv.startJob(ctx, "", spec, "credential/"+cr.ID, c.Username)
	}
	if err != nil {
		if ferr := a.finishBootstrap(cr.ID, "", store.BootstrapSet{Status: new(model.BootstrapFailed), Error: new("could not start the job: " + err.Error())}); ferr != nil {
			a.log.ErrorContext(ctx, "roll back a bootstrap whose job did not start", "credential", cr.ID, "err", ferr)
		}
		return api.BootstrapResult{}, err
	}
	// The job records itself too; whichever comes first.
	if _, err := a.creds.SetBootstrapJob(ctx, cr.ID, jobID); err != nil {
		a.log.WarnContext(ctx, "record bootstrap job", "credential", cr.ID, "job", jobID, "err", err)
	}
	a.log.InfoContext(ctx, "credential bootstrap started", "credential", cr.ID, "job", jobID, "destroy", destroy, "by", c.Username)
	return api.BootstrapResult{JobID: jobID, Status: status}, nil
}

// finishBootstrap updates the bootstrap state if job jobID still holds it, retrying until the
// store has it (store.Persist: its own context, so a cancelled job's final state lands too).
func (a *credentialAPI) finishBootstrap(credID, jobID string, set store.BootstrapSet) error {
	var matched bool
	err := a.vault.Persist(context.Background(), "bootstrap state of credential "+credID, 0, func(ctx context.Context) error {
		var err error
		matched, err = a.creds.UpdateBootstrap(ctx, credID, jobID, set)
		return err
	})
	if err != nil {
		a.log.Error("update bootstrap state", "credential", credID, "job", jobID, "err", err)
		return fmt.Errorf("update bootstrap state of credential %s: %w", credID, err)
	}
	if !matched {
		return fmt.Errorf("credential %s: bootstrap is no longer held by job %s", credID, jobID)
	}
	return nil
}

// bootstrapParams are a credential.bootstrap job's params (job.get shows them).
type bootstrapParams struct {
	Credential string `json:"credential"` // the credential's id
	Destroy    bool   `json:"destroy"`    // destroy the bootstrap's resources instead
}

// bootstrapResult is a credential.bootstrap job's result: the credential and the names of its
// bootstrap outputs, or (a destroy) the content ids destroyed. Outputs and Destroyed are
// pointers so that the one the job sets is shown even when empty (null).
type bootstrapResult struct {
	Credential string    `json:"credential"`
	Outputs    *[]string `json:"outputs,omitempty"`
	Destroyed  *[]string `json:"destroyed,omitempty"`
}

// runBootstrap is the job (resume: recovered after a restart).
func (a *credentialAPI) runBootstrap(ctx context.Context, j *jobCtx, p bootstrapParams, resume bool) (bootstrapResult, error) {
	id, destroy := p.Credential, p.Destroy
	var red redactor
	res, err := a.bootstrapWork(ctx, j, id, destroy, resume, &red)
	if err != nil {
		err = red.Err(err)
		if resume {
			err = fmt.Errorf("kloud restarted during the bootstrap, then: %w", err)
		}
		if ferr := a.finishBootstrap(id, j.ID, store.BootstrapSet{Status: new(model.BootstrapFailed), Error: new(err.Error())}); ferr != nil {
			a.log.ErrorContext(ctx, "record a failed bootstrap", "credential", id, "job", j.ID, "err", ferr)
		}
		return bootstrapResult{}, err
	}
	return res, nil
}

func (a *credentialAPI) bootstrapWork(ctx context.Context, j *jobCtx, id string, destroy, resume bool, red *redactor) (bootstrapResult, error) {
	stage := string(provider.Building)
	if destroy {
		stage = string(provider.Terminating)
	}
	j.Progress(ctx, 5, stage, "Fetching the credential")
	cr, err := a.creds.Get(ctx, id)
	if err != nil {
		return bootstrapResult{}, err
	}
	b := cr.Bootstrap
	if b == nil || (b.Status != model.BootstrapRunning && b.Status != model.BootstrapDestroying) || (b.JobID != "" && b.JobID != j.ID) {
		return bootstrapResult{}, fmt.Errorf("credential %s: its bootstrap is not held by this job (anymore)", id)
	}
	held, err := a.creds.SetBootstrapJob(ctx, id, j.ID)
	if err != nil {
		return bootstrapResult{}, err
	}
	if !held {
		return bootstrapResult{}, fmt.Errorf("credential %s: its bootstrap is held by another job", id)
	}
	prov, err := a.providers.Lookup(cr.Provider)
	if err != nil {
		return bootstrapResult{}, err
	}
	pc, err := a.providerCredential(prov, &cr)
	if err != nil {
		return bootstrapResult{}, err
	}
	*red = secretValues(pc.Value, provider.SecretFields(pc.Value))
	tf, err := a.srv.terraformer()
	if err != nil {
		return bootstrapResult{}, err
	}
	vars, _ := credentialVariables(prov, pc)
	var prior []string
	if resume {
		prior = b.TFJobs
	}
	w := &bootstrapRun{a: a, j: j, tf: tf, cred: &cr, red: *red, stage: stage, prior: prior}
	if destroy {
		return w.destroy(ctx)
	}
	return w.apply(ctx, prov, pc, vars)
}

// bootstrapRun is one bootstrap job's work.
type bootstrapRun struct {
	a      *credentialAPI
	j      *jobCtx
	tf     Terraformer
	cred   *model.Credential
	red    redactor
	stage  string
	prior  []string // terraformer jobs of the interrupted run (resume)
	tfJobs []string
}

// start submits template i's Terraform run, or re-attaches to the interrupted run's.
func (w *bootstrapRun) start(ctx context.Context, i int, submit func() (string, error)) (string, error) {
	if i < len(w.prior) && w.prior[i] != "" {
		w.j.Logf(ctx, "re-attaching to terraform job %s", w.prior[i])
		w.tfJobs = append(w.tfJobs, w.prior[i])
		return w.prior[i], nil
	}
	id, err := stackbuild.SubmitTF(ctx, w.j, submit) // waits for a restarting terraformer, or a run of the content still going
	if err != nil {
		return "", err
	}
	w.tfJobs = append(w.tfJobs, id)
	// Recorded before waiting, so a recovered job finds it.
	if _, err := w.a.creds.UpdateBootstrap(ctx, w.cred.ID, w.j.ID, store.BootstrapSet{TFJobs: new(slices.Clone(w.tfJobs))}); err != nil {
		w.a.log.WarnContext(ctx, "record terraform job", "credential", w.cred.ID, "job", w.j.ID, "terraform_job", id, "err", err)
	}
	return id, nil
}

// wait follows a Terraform job, mapping its progress into [base, base+span] and its log lines
// (redacted) into the job's log.
func (w *bootstrapRun) wait(ctx context.Context, tfJob string, base, span int, msg string) (*tfapi.Job, error) {
	last := base
	w.j.Progress(ctx, base, w.stage, msg)
	final, err := w.tf.Wait(ctx, tfJob, func(ev tfapi.Event) {
		switch ev.Type {
		case tfapi.EventLog:
			if ev.Line != "" {
				w.j.Logf(ctx, "%s", w.red.String(ev.Line))
			}
		case tfapi.EventDiagnostic:
			if d := ev.Diagnostic; d != nil {
				w.j.Logf(ctx, "%s: %s", d.Severity, w.red.String(d.String()))
			}
		}
		if pct := base + ev.Percent*span/100; pct > last {
			last = pct
			w.j.Progress(ctx, pct, w.stage, msg)
		}
	})
	if final == nil { // the job's own failure comes back with the job; this is following failing
		if err == nil {
			err = errors.New("terraformer returned no job")
		}
		if ctx.Err() != nil {
			cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, cerr := w.tf.Cancel(cctx, tfJob); cerr != nil {
				w.a.log.WarnContext(ctx, "cancel terraform job", "terraform_job", tfJob, "err", cerr)
			}
		}
		return nil, fmt.Errorf("follow terraform job %s: %w", tfJob, err)
	}
	if final.Status != tfapi.StatusSucceeded {
		why := string(final.Status)
		if final.Error != nil {
			why = final.Error.Message
		}
		return final, fmt.Errorf("terraform %s of %s: %s", final.Op, final.ContentID, why)
	}
	return final, nil
}

// declaredVars keeps the credential variables the template declares: Terraform warns about
// every value it gets for an undeclared one. A template that does not parse gets them all
// (Terraform then says what is wrong with it).
func declaredVars(files map[string][]byte, vars map[string]any) map[string]any {
	cfg, err := tmpl.Parse(files)
	if err != nil {
		return vars
	}
	out := map[string]any{}
	for _, v := range cfg.Variables() {
		if x, ok := vars[v.Name]; ok {
			out[v.Name] = x
		}
	}
	return out
}

func mergeVars(a, b map[string]any) map[string]any {
	out := make(map[string]any, len(a)+len(b))
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}

func (w *bootstrapRun) apply(ctx context.Context, prov *provider.Provider, pc *provider.Credential, vars map[string]any) (bootstrapResult, error) {
	st, err := w.a.providerStack(prov, w.cred, w.cred.Owner)
	if err != nil {
		return bootstrapResult{}, err
	}
	tmpls, err := st.BootstrapTemplates(ctx, pc)
	if err != nil {
		return bootstrapResult{}, fmt.Errorf("provider %s: bootstrap templates: %w", prov.Name, err)
	}
	ids := make([]string, len(tmpls))
	all := slices.Clone(w.cred.Bootstrap.ContentIDs)
	for i, t := range tmpls {
		ids[i] = t.Key
		if ids[i] == "" {
			ids[i] = bootstrapContentID(w.cred.Team, w.cred.ID, i)
		}
		if !slices.Contains(all, ids[i]) {
			all = append(all, ids[i])
		}
	}
	// Recorded first: whatever Terraform creates can be destroyed, also after a failure.
	if held, err := w.a.creds.UpdateBootstrap(ctx, w.cred.ID, w.j.ID, store.BootstrapSet{ContentIDs: &all}); err != nil {
		return bootstrapResult{}, fmt.Errorf("record bootstrap content ids: %w", err)
	} else if !held {
		return bootstrapResult{}, fmt.Errorf("record bootstrap content ids: credential %s: its bootstrap is no longer held by job %s", w.cred.ID, w.j.ID)
	}
	outputs := map[string]any{}
	n := max(len(tmpls), 1)
	for i, t := range tmpls {
		tfJob, err := w.start(ctx, i, func() (string, error) {
			return w.tf.Apply(ctx, tfapi.Request{ContentID: ids[i], Files: tfapi.Files(t.Files),
				Variables: mergeVars(declaredVars(t.Files, vars), t.Variables), TraceID: w.j.ID})
		})
		if err != nil {
			return bootstrapResult{}, fmt.Errorf("terraform apply of %s: %w", ids[i], err)
		}
		final, err := w.wait(ctx, tfJob, 10+80*i/n, 80/n, fmt.Sprintf("Applying bootstrap template %d of %d", i+1, len(tmpls)))
		if err != nil {
			return bootstrapResult{}, err
		}
		if final.Result != nil && final.Result.Outputs != nil {
			for k, o := range final.Result.Outputs {
				outputs[k] = o.Value
			}
		} else {
			outs, err := w.tf.Outputs(ctx, ids[i])
			if err != nil {
				return bootstrapResult{}, fmt.Errorf("outputs of %s: %w", ids[i], err)
			}
			for k, v := range outs {
				outputs[k] = v
			}
		}
	}
	w.j.Progress(ctx, 92, w.stage, "Storing the bootstrap outputs")
	var val any = outputs
	if prov.HasPart(provider.PartBootstrap) {
		known := map[string]any{}
		for _, f := range provider.SchemaFields(prov.JSONSchema(provider.PartBootstrap)) {
			if v, ok := outputs[f.Name]; ok {
				known[f.Name] = v
			}
		}
		raw, err := json.Marshal(known)
		if err != nil {
			return bootstrapResult{}, fmt.Errorf("bootstrap outputs: %w", err)
		}
		if val, err = prov.DecodePart(ctx, provider.PartBootstrap, raw, nil); err != nil {
			return bootstrapResult{}, fmt.Errorf("bootstrap outputs do not fit provider %s: %w", prov.Name, err)
		}
		w.red = append(w.red, secretValues(val, partSecrets(prov, provider.PartBootstrap))...)
	}
	plain, err := json.Marshal(val)
	if err != nil {
		return bootstrapResult{}, fmt.Errorf("bootstrap outputs: %w", err)
	}
	sealed, err := w.a.vault.Seal(plain, bootstrapAAD(w.cred.ID))
	if err != nil {
		return bootstrapResult{}, err
	}
	var names []string
	for k := range provider.JSONMap(val) {
		names = append(names, k)
	}
	sort.Strings(names)
	if err := w.a.finishBootstrap(w.cred.ID, w.j.ID, store.BootstrapSet{Status: new(model.BootstrapDone), Sealed: &sealed,
		Outputs: &names, Error: new("")}); err != nil {
		return bootstrapResult{}, err
	}
	w.j.Progress(ctx, 100, string(provider.Running), "Bootstrap finished")
	return bootstrapResult{Credential: w.cred.ID, Outputs: &names}, nil
}

func (w *bootstrapRun) destroy(ctx context.Context) (bootstrapResult, error) {
	ids := slices.Clone(w.cred.Bootstrap.ContentIDs)
	slices.Reverse(ids)
	n := max(len(ids), 1)
	for i, cid := range ids {
		tfJob, err := w.start(ctx, i, func() (string, error) {
			// No files and no variables: those of the apply, which terraformer keeps.
			return w.tf.Destroy(ctx, tfapi.Request{ContentID: cid, TraceID: w.j.ID})
		})
		if errors.Is(err, kite.ErrNotFound) {
			w.tfJobs = append(w.tfJobs, "") // keeps the indexes of a resumed run
			w.j.Logf(ctx, "nothing was ever applied for %s", cid)
			continue
		}
		if err != nil {
			return bootstrapResult{}, fmt.Errorf("terraform destroy of %s: %w", cid, err)
		}
		if _, err := w.wait(ctx, tfJob, 10+85*i/n, 85/n, fmt.Sprintf("Destroying bootstrap resources %d of %d", i+1, len(ids))); err != nil {
			return bootstrapResult{}, err
		}
	}
	var none []byte
	if err := w.a.finishBootstrap(w.cred.ID, w.j.ID, store.BootstrapSet{Status: new(model.BootstrapDestroyed), Sealed: &none,
		Outputs: new([]string{}), ContentIDs: new([]string{}), TFJobs: new([]string{}), Error: new("")}); err != nil {
		return bootstrapResult{}, err
	}
	w.j.Progress(ctx, 100, string(provider.Terminated), "Bootstrap resources destroyed")
	return bootstrapResult{Credential: w.cred.ID, Destroyed: &ids}, nil
}
