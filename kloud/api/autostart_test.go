package api_test

import (
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/kloud/api"
)

// TestAutostartSchedule: schedules name their days (lists, ranges that wrap the week) and a
// time; the next start is on an allowed day, after the given time, in the schedule's zone
// across a daylight-saving change; bad schedules, idle timeouts and zones say what to give.
func TestAutostartSchedule(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		schedule string
		from     time.Time
		want     time.Time
	}{
		// 2026-11-27 is a Friday.
		{"mon-fri 09:00", time.Date(2026, 11, 27, 7, 59, 0, 0, time.UTC), time.Date(2026, 11, 27, 9, 0, 0, 0, berlin)},
		{"mon-fri 09:00", time.Date(2026, 11, 27, 8, 0, 0, 0, time.UTC), time.Date(2026, 11, 30, 9, 0, 0, 0, berlin)},
		{"weekdays 09:00", time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC), time.Date(2026, 11, 30, 9, 0, 0, 0, berlin)},
		{"fri-mon 23:30", time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 12, 4, 23, 30, 0, 0, berlin)},
		{"sat,SUN 10:00", time.Date(2026, 11, 27, 0, 0, 0, 0, time.UTC), time.Date(2026, 11, 28, 10, 0, 0, 0, berlin)},
		{"daily 08:30", time.Date(2026, 11, 27, 7, 30, 0, 0, time.UTC), time.Date(2026, 11, 28, 8, 30, 0, 0, berlin)},
		// Berlin moves to summer time on 2026-03-29: 09:00 is 07:00 UTC from then on.
		{"daily 09:00", time.Date(2026, 3, 28, 9, 0, 0, 0, time.UTC), time.Date(2026, 3, 29, 7, 0, 0, 0, time.UTC)},
	} {
		sc, loc, err := api.ParseAutostart(c.schedule, "Europe/Berlin")
		if err != nil {
			t.Errorf("%q: %v", c.schedule, err)
			continue
		}
		if got := sc.Next(c.from, loc); !got.Equal(c.want) {
			t.Errorf("%q after %s: %s, want %s", c.schedule, c.from, got, c.want.UTC())
		}
	}
	for _, bad := range []struct{ schedule, tz, want string }{
		{"daily 24:00", "", "is not HH:MM"}, {"daily 9:5", "", "is not HH:MM"}, {"someday 09:00", "", "unknown day"},
		{"09:00", "", "two parts"}, {"mon-fri 09:00", "Mars/Olympus", "IANA time zone"},
		{"mon-fri 09:00", "Local", "IANA time zone"},
	} {
		if _, _, err := api.ParseAutostart(bad.schedule, bad.tz); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%q %q: %v, want %q", bad.schedule, bad.tz, err, bad.want)
		}
	}
	for _, bad := range []string{"soon", "-5m", "1.5s", "500ms", "9000h"} {
		if _, err := api.ParseIdleTimeout(bad); err == nil || !strings.Contains(err.Error(), "idleTimeout") {
			t.Errorf("idle timeout %q: %v", bad, err)
		}
	}
	for v, want := range map[string]int64{"0": 0, "30m": 1800, "1h30m": 5400} {
		if n, err := api.ParseIdleTimeout(v); err != nil || n == nil || *n != want {
			t.Errorf("idle timeout %q: %v %v", v, n, err)
		}
	}
	if n, err := api.ParseIdleTimeout("default"); err != nil || n != nil {
		t.Errorf("idle timeout default: %v %v", n, err)
	}
}
