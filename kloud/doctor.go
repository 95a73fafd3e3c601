package kloud

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/kloud-dev/kloud/internal/version"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/terraformer/tfapi"
)

// kloud.doctor (`kloud doctor`, docs/operations.md; opsAPI.kloudDoctor): readiness's checks
// (store, terraformer, each provider) with what to do for each failure, plus the store's
// atomicity and clock, the terraformer's and terraform's versions and the checks kloud serve
// adds (Options.Doctor: the provider mirror, the local provider's base image).

// MaxClockSkew is the largest difference between kloud's clock and the store's that doctor
// accepts: leases, job expiry and tokens compare the two.
const MaxClockSkew = 2 * time.Second

// DoctorCheck is a check kloud serve adds to kloud.doctor (Options.Doctor).
type DoctorCheck func(ctx context.Context) api.DoctorCheck

// doctorTimeout bounds each of doctor's checks that talks to something.
const doctorTimeout = 5 * time.Second

// kloudVersion serves kloud.version.
func (o *opsAPI) kloudVersion(ctx context.Context, c *Caller, _ *kite.Request, _ *api.NoParams) (api.VersionResult, error) {
	return api.VersionResult{Version: version.Version}, nil
}

// kloudDoctor serves kloud.doctor.
func (o *opsAPI) kloudDoctor(ctx context.Context, c *Caller, _ *kite.Request, _ *api.NoParams) (api.DoctorResult, error) {
	res := api.DoctorResult{KloudVersion: version.Version}
	add := func(ch api.DoctorCheck) { res.Checks = append(res.Checks, ch) }
	rd := o.readiness(ctx)

	st := rd.Checks["store"]
	add(api.DoctorCheck{Name: "store", OK: st.Ready, Required: true, Error: st.Error, Detail: o.storeDetail(),
		Fix: "kloud's database does not answer: with --mongo-url, check that MongoDB runs and the URL is right; the embedded store lives in <data dir>/db (kloud's log names the cause)"})
	if st.Ready {
		cctx, cancel := context.WithTimeout(ctx, doctorTimeout)
		err := o.store.AtomicCheck(cctx)
		cancel()
		add(errCheck("store.atomic", true, err, "concurrent conditional updates of one document each saw their own value",
			"jobs, leases and quotas need atomic single-document updates: use a real MongoDB (a replica set for several kloud replicas), or a FerretDB v1 with ?maxPoolSize=1"))
		cctx, cancel = context.WithTimeout(ctx, doctorTimeout)
		before := time.Now()
		dbTime, err := o.store.ServerTime(cctx)
		after := time.Now()
		cancel()
		ch := api.DoctorCheck{Name: "clock.store", Required: true,
			Fix: "synchronise the clocks of kloud's host and the database's (NTP: systemd-timesyncd or chrony); leases, job expiry and tokens compare them"}
		if err != nil {
			ch.Error = err.Error()
		} else {
			// The store's time against the middle of the round trip.
			skew := dbTime.Sub(before.Add(after.Sub(before) / 2))
			ch.Detail = fmt.Sprintf("the store's clock is %s off kloud's (at most %s)", skew.Round(time.Millisecond), MaxClockSkew)
			if skew.Abs() > MaxClockSkew+after.Sub(before) {
				ch.Error = "clock skew " + skew.Round(time.Millisecond).String()
			} else {
				ch.OK = true
			}
		}
		add(ch)
	}

	tf := rd.Checks["terraformer"]
	ch := api.DoctorCheck{Name: "terraformer", OK: tf.Ready, Required: true, Error: tf.Error,
		Fix: "kloud serve restarts the terraformer it started (its log lines start with \"terraformer: \"); with --terraformer-url, start terraformer there and check it answers <url>/readyz"}
	if tf.Ready {
		if h, ok := o.terraformerHealth(ctx); ok {
			ch.Detail = h.detail
			if h.err != nil {
				ch.OK, ch.Error = false, h.err.Error()
			}
			if h.version != "" {
				add(versionCheck(h.version))
			}
		}
	}
	add(ch)

	for _, n := range o.providers.Names() {
		p := rd.Checks["provider."+n]
		add(api.DoctorCheck{Name: "provider." + n, OK: p.Ready, Error: p.Error,
			Fix: "provider " + n + " cannot build machines on this host until this is fixed (the other providers work); see docs/admin-guide.md for what it needs"})
	}
	for _, f := range o.checks {
		cctx, cancel := context.WithTimeout(ctx, doctorTimeout)
		add(f(cctx))
		cancel()
	}
	res.ServerTime = time.Now().UTC()
	return res, nil
}

// storeDetail says which store kloud uses.
func (o *opsAPI) storeDetail() string {
	if o.store.Embedded() {
		return "embedded (" + o.dataDir + "/db)"
	}
	return "external MongoDB"
}

// errCheck is a check that passed unless err.
func errCheck(name string, required bool, err error, detail, fix string) api.DoctorCheck {
	ch := api.DoctorCheck{Name: name, OK: err == nil, Required: required, Detail: detail, Fix: fix}
	if err != nil {
		ch.Error, ch.Detail = err.Error(), ""
	}
	return ch
}

// versionCheck compares kloud's version with its terraformer's: a mismatch is a warning.
func versionCheck(tfVersion string) api.DoctorCheck {
	ch := api.DoctorCheck{Name: "versions", OK: tfVersion == version.Version,
		Detail: "kloud " + version.Version + ", terraformer " + tfVersion,
		Fix:    "run the kloud and terraformer of one release (make build builds both; kloud serve starts the terraformer next to its binary)"}
	if !ch.OK {
		ch.Error = "kloud and terraformer are of different versions"
	}
	return ch
}

type tfHealth struct {
	version, detail string
	err             error
}

// terraformerHealth asks the terraformer's /healthz and /readyz (ok false: this terraformer
// client cannot say).
func (o *opsAPI) terraformerHealth(ctx context.Context) (tfHealth, bool) {
	t, err := o.terraformer()
	if err != nil {
		return tfHealth{}, false
	}
	hc, ok := t.(interface {
		Health(context.Context) (tfapi.Health, error)
	})
	if !ok {
		return tfHealth{}, false
	}
	cctx, cancel := context.WithTimeout(ctx, doctorTimeout)
	defer cancel()
	h, err := hc.Health(cctx)
	out := tfHealth{version: h.Version, detail: fmt.Sprintf("terraformer %s at %s, terraform %s", h.Version, h.URL, h.Terraform)}
	switch {
	case err != nil:
		out.err = fmt.Errorf("terraformer at %s does not answer: %w", h.URL, err)
	case !h.Readiness.Ready:
		var why []string
		for _, n := range h.Readiness.NotReady {
			why = append(why, n+": "+h.Readiness.Checks[n].Error)
		}
		out.err = fmt.Errorf("terraformer is not ready: %s", strings.Join(why, "; "))
	}
	return out, true
}
