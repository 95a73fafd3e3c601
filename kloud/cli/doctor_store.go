package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/store/storerace"
)

// raceFlags are kloud doctor --mongo-url's settings.
type raceFlags struct {
	mongoURL                 string
	rounds, clients, workers int
}

// runStoreRace is kloud doctor --mongo-url: the store.race check (kloud/store/storerace)
// against that store, from this host.
func runStoreRace(ctx context.Context, g *globals, f raceFlags) error {
	if f.rounds <= 0 || f.clients <= 0 || f.workers <= 0 {
		return fmt.Errorf("--race-rounds, --race-clients and --race-workers must be positive")
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
	defer cancel()
	c := raceCheck(ctx, f)
	checks := []api.DoctorCheck{c}
	if g.json {
		if err := g.printJSON(map[string]any{"ok": c.OK, "checks": checks}); err != nil {
			return err
		}
	} else {
		printDoctor(g, checks)
	}
	if !c.OK {
		return errDoctorFailed
	}
	return nil
}

func raceCheck(ctx context.Context, f raceFlags) api.DoctorCheck {
	c := api.DoctorCheck{Name: "store.race", Required: true,
		Fix: "several kloud replicas need atomic single-document updates with several writers: use a MongoDB replica set, or kloud store serve (not a plain FerretDB v1, which runs updates as read, modify, write back)"}
	start := time.Now()
	res, err := storerace.RaceURL(ctx, f.mongoURL, f.clients, storerace.Options{Rounds: f.rounds, Workers: f.workers})
	if err != nil {
		c.Error = err.Error()
		return c
	}
	summary := fmt.Sprintf("%d clients × %d goroutines, %s, in %s", f.clients, f.workers, res, time.Since(start).Round(time.Millisecond))
	if res.OK() {
		c.OK, c.Detail = true, summary
	} else {
		c.Error = summary
	}
	return c
}
