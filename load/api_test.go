package load

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
)

// machineTemplate is a stack template of one dummy machine (a klient process of this host).
func machineTemplate(n int, note string) map[string]string {
	return map[string]string{"main.tf": fmt.Sprintf(`# %s
resource "terraform_data" "vm" {
  count = %d
  input = "#!/bin/bash\necho hello"
}
`, note, n)}
}

// apiClient is one simulated member: a kite connection of their own key and what they made.
type apiClient struct {
	c          *api.Client
	template   string
	credential string
	rev        int
}

// apiOp is one kind of call of the mix, with its weight.
type apiOp struct {
	method string
	weight int
	call   func(ctx context.Context, a *apiClient) error
}

// apiMix is what a team's members do in the browser and the CLI: mostly reads of their lists
// and a template, some writes (a template revision, a credential's field, a credential added
// and removed).
var apiMix = []apiOp{
	{api.MethodStackList, 20, func(ctx context.Context, a *apiClient) error {
		_, err := a.c.StackList(ctx, api.StackListParams{})
		return err
	}},
	{api.MethodMachineList, 20, func(ctx context.Context, a *apiClient) error {
		_, err := a.c.MachineList(ctx, api.MachineListParams{})
		return err
	}},
	{api.MethodTemplateGet, 15, func(ctx context.Context, a *apiClient) error {
		_, err := a.c.TemplateGet(ctx, api.TemplateGetParams{TemplateID: a.template})
		return err
	}},
	{api.MethodTemplateList, 10, func(ctx context.Context, a *apiClient) error {
		_, err := a.c.TemplateList(ctx, api.TemplateListParams{})
		return err
	}},
	{api.MethodJobList, 10, func(ctx context.Context, a *apiClient) error {
		_, err := a.c.JobList(ctx, api.JobListParams{})
		return err
	}},
	{api.MethodCredentialList, 10, func(ctx context.Context, a *apiClient) error {
		_, err := a.c.CredentialList(ctx, api.CredentialListParams{})
		return err
	}},
	{api.MethodTemplateUpdate, 5, func(ctx context.Context, a *apiClient) error {
		a.rev++
		_, err := a.c.TemplateUpdate(ctx, api.TemplateParams{TemplateID: a.template, Files: machineTemplate(1, fmt.Sprintf("revision %d", a.rev))})
		return err
	}},
	{api.MethodCredentialUpdate, 5, func(ctx context.Context, a *apiClient) error {
		_, err := a.c.CredentialUpdate(ctx, api.CredentialUpdateParams{CredentialID: a.credential, Data: json.RawMessage(fmt.Sprintf(`{"token":"t%d"}`, rand.Int()))})
		return err
	}},
	{api.MethodCredentialAdd + " + remove", 5, func(ctx context.Context, a *apiClient) error {
		r, err := a.c.CredentialAdd(ctx, api.CredentialAddParams{Provider: "dummy", Title: "scratch", Data: json.RawMessage(`{"token":"abc123"}`)})
		if err != nil {
			return err
		}
		_, err = a.c.CredentialRemove(ctx, api.CredentialRef{CredentialID: r.ID})
		return err
	}},
}

// TestLoadAPI: LOAD_CLIENTS connections (full 1,000, tiny 20) of LOAD_MEMBERS members (full
// 100, tiny 20; a member's browser tabs and CLI are several connections of one key) in teams
// of 10 call kloud's methods (apiMix) one after another, as fast as kloud answers, for
// LOAD_DURATION (full 60 s, tiny 3 s). Each connection edits a template of its own (two tabs
// saving one template at once is a conflict, -32004, by design); the connections of a member
// share its credential, and a conflict updating it is counted apart. Target: 0 errors. kloud runs
// with its default limits (--rate-limit 20/s, --rate-burst 100 per member). It prints calls/s,
// p50/p99 per method and the store's share.
func TestLoadAPI(t *testing.T) {
	t.Parallel()
	n := size(t, "LOAD_CLIENTS", 1000, 20)
	members := min(n, size(t, "LOAD_MEMBERS", 100, 20))
	dur := duration(t, "LOAD_DURATION", 60*time.Second, 3*time.Second)
	k := startKloud(t)
	ctx := context.Background()
	admin := k.admin(ctx)
	teams := (members + 9) / 10
	for i := range teams {
		if _, err := api.NewClient(admin).TeamCreate(ctx, api.TeamCreateParams{Slug: fmt.Sprintf("team%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	keys := k.addUsers(ctx, admin, "member", members, func(i int) string { return fmt.Sprintf("team%d", i/10) })
	creds := make([]string, members)
	if err := fanOut(ctx, members, 16, func(ctx context.Context, i int) error {
		c, err := k.dial(ctx, keys[i], time.Minute)
		if err != nil {
			return fmt.Errorf("member%d: dial: %w", i, err)
		}
		cr, err := api.NewClient(c).CredentialAdd(ctx, api.CredentialAddParams{Provider: "dummy", Title: "mine", Data: json.RawMessage(`{"token":"abc123"}`)})
		if err != nil {
			return fmt.Errorf("member%d: credential.add: %w", i, err)
		}
		creds[i] = cr.ID
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	// Each connection and its template (setup, not measured).
	clients := make([]*apiClient, n)
	if err := fanOut(ctx, n, 16, func(ctx context.Context, i int) error {
		c, err := k.dial(ctx, keys[i%members], 0) // a rate-limited call is an error of the load
		if err != nil {
			return fmt.Errorf("connection %d: dial: %w", i, err)
		}
		a := &apiClient{c: api.NewClient(c), credential: creds[i%members]}
		tp, err := a.c.TemplateCreate(ctx, api.TemplateParams{Title: "demo", Files: machineTemplate(1, "revision 0")})
		if err != nil {
			return fmt.Errorf("connection %d: template.create: %w", i, err)
		}
		a.template = tp.ID
		clients[i] = a
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	total := 0
	for _, op := range apiMix {
		total += op.weight
	}
	type result struct {
		lat       []time.Duration
		errs      int
		conflicts int // -32004: a member's connections updating their one credential at once (by design)
	}
	var (
		mu      sync.Mutex
		results = map[string]*result{}
		errMsgs = map[string]int{}
	)
	rss0 := rss(k.pid())
	rssPeak := peak(func() int64 { return rss(k.pid()) })
	adminKey := k.adminKey()
	store0 := storeTotals(t, k.url(), adminKey)
	start := time.Now()
	deadline := start.Add(dur)
	var wg sync.WaitGroup
	for _, a := range clients {
		wg.Go(func() {
			local := map[string]*result{}
			localErr := map[string]int{}
			for time.Now().Before(deadline) {
				w := rand.IntN(total)
				op := apiMix[0]
				for _, o := range apiMix {
					if w < o.weight {
						op = o
						break
					}
					w -= o.weight
				}
				cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				t0 := time.Now()
				err := op.call(cctx, a)
				d := time.Since(t0)
				cancel()
				r := local[op.method]
				if r == nil {
					r = &result{}
					local[op.method] = r
				}
				if errors.Is(err, kite.ErrConflict) {
					r.conflicts++
					continue
				}
				if err != nil {
					r.errs++
					localErr[errKind(op.method, err)]++
					continue
				}
				r.lat = append(r.lat, d)
			}
			mu.Lock()
			defer mu.Unlock()
			for m, r := range local {
				g := results[m]
				if g == nil {
					g = &result{}
					results[m] = g
				}
				g.lat = append(g.lat, r.lat...)
				g.errs += r.errs
				g.conflicts += r.conflicts
			}
			for e, c := range localErr {
				errMsgs[e] += c
			}
		})
	}
	wg.Wait()
	wall := time.Since(start)
	rssMax := rssPeak()
	rss1 := rss(k.pid())
	store1 := storeTotals(t, k.url(), adminKey)

	methods := make([]string, 0, len(results))
	calls, errs, conflicts := 0, 0, 0
	var all []time.Duration
	for m, r := range results {
		methods = append(methods, m)
		calls += len(r.lat) + r.errs + r.conflicts
		errs += r.errs
		conflicts += r.conflicts
		all = append(all, r.lat...)
	}
	sort.Strings(methods)
	c := commit()
	lines := []string{fmt.Sprintf("| %d connections of %d members (teams of 10) for %s (`%s`) | %d calls, **%d errors**, %d conflicts (-32004, by design) | %.0f calls/s | answered calls p50 %s, p99 %s | kloud RSS %s before, max %s during, %s after | %s |",
		n, members, dur, "make load", calls, errs, conflicts, float64(calls)/wall.Seconds(), ms(pct(all, 50)), ms(pct(all, 99)), mib(rss0), mib(max(rssMax, rss1)), mib(rss1), c)}
	storeN, storeSecs := store1.n-store0.n, store1.secs-store0.secs
	lines = append(lines, "", fmt.Sprintf("Store during the load: %.0f commands (%.1f per call), %.1f s of command time in %.1f s of wall time (mean %.2f ms a command; the embedded store serves one command at a time).",
		storeN, storeN/float64(max(calls, 1)), storeSecs, wall.Seconds(), 1000*storeSecs/max(storeN, 1)))
	var ops []string
	for op, c := range store1.byOp {
		d := store0.byOp[op]
		if n := c[0] - d[0]; n > 0 {
			ops = append(ops, fmt.Sprintf("%s %.0f× %.1f s", op, n, c[1]-d[1]))
		}
	}
	sort.Strings(ops)
	lines = append(lines, "", "Store commands: "+strings.Join(ops, ", ")+".")
	lines = append(lines, "", "| method | calls | errors | conflicts | p50 | p99 | max (of the calls answered) |", "|---|---|---|---|---|---|---|")
	for _, m := range methods {
		r := results[m]
		lines = append(lines, fmt.Sprintf("| %s | %d | %d | %d | %s | %s | %s |", m, len(r.lat)+r.errs+r.conflicts, r.errs, r.conflicts, ms(pct(r.lat, 50)), ms(pct(r.lat, 99)), ms(pct(r.lat, 100))))
	}
	report(lines...)
	if errs > 0 {
		var es []string
		for e, c := range errMsgs {
			es = append(es, fmt.Sprintf("%d× %s", c, e))
		}
		sort.Strings(es)
		t.Errorf("%d of %d calls failed (target 0):\n%s", errs, calls, strings.Join(es, "\n"))
	}
}

// storeSums are the totals of kloud's store command histogram.
type storeSums struct {
	n, secs float64
	byOp    map[string][2]float64 // operation → count, seconds
}

// storeTotals reads kloud_store_command_duration_seconds' count and sum over every command
// from kloud's /metrics (as an administrator).
func storeTotals(t *testing.T, base, adminKey string) storeSums {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, base+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+adminKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s: %s", resp.Status, b)
	}
	s := storeSums{byOp: map[string][2]float64{}}
	for _, l := range strings.Split(string(b), "\n") {
		name, rest, ok := strings.Cut(l, "{")
		if !ok {
			continue
		}
		_, val, _ := strings.Cut(rest, "} ")
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			continue
		}
		op := ""
		if _, after, ok := strings.Cut(rest, `operation="`); ok {
			op, _, _ = strings.Cut(after, `"`)
		}
		c := s.byOp[op]
		switch name {
		case "kloud_store_command_duration_seconds_count":
			s.n += v
			c[0] += v
		case "kloud_store_command_duration_seconds_sum":
			s.secs += v
			c[1] += v
		}
		s.byOp[op] = c
	}
	return s
}

// errKind names an error for the summary: the method and the kite error's code and type, or
// its text.
func errKind(method string, err error) string {
	var ke *kite.Error
	if errors.As(err, &ke) {
		msg := ke.Message
		if len(msg) > 160 {
			msg = msg[:160]
		}
		return fmt.Sprintf("%s: %d %s", method, ke.Code, msg)
	}
	s := err.Error()
	if len(s) > 160 {
		s = s[:160]
	}
	return method + ": " + s
}
