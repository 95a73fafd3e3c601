package api_test

import (
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
)

// TestPoolSize: a pool's size by its schedule, in its time zone; windows past midnight; the
// first window that holds the time wins; outside them, Size.
func TestPoolSize(t *testing.T) {
	p := model.Pool{Size: 1, TimeZone: "Europe/Berlin", Schedule: []model.PoolWindow{
		{Days: "weekdays", From: "08:00", To: "18:00", Size: 5},
		{Days: "fri", From: "22:00", To: "02:00", Size: 2}, // Friday night into Saturday
		{Days: "daily", From: "07:00", To: "19:00", Size: 3},
	}}
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatalf("this host has no time zone data: %v", err)
	}
	at := func(day, hm string) time.Time { // 2026-11-30 is a Monday
		d := map[string]int{"mon": 30, "fri": 4, "sat": 5, "sun": 6}[day]
		m := time.December
		if d == 30 {
			m = time.November
		}
		tm, _ := time.ParseInLocation("15:04", hm, berlin)
		return time.Date(2026, m, d, tm.Hour(), tm.Minute(), 0, 0, berlin)
	}
	for _, c := range []struct {
		day, hm string
		want    int
	}{
		{"mon", "07:59", 3}, {"mon", "08:00", 5}, {"mon", "17:59", 5}, {"mon", "18:00", 3}, {"mon", "19:00", 1},
		{"fri", "22:30", 2}, {"sat", "01:59", 2}, {"sat", "02:00", 1}, {"sat", "12:00", 3}, {"sun", "01:00", 1},
	} {
		// The same instant in UTC: the schedule is read in the pool's zone.
		if got := api.PoolSize(p, at(c.day, c.hm).UTC()); got != c.want {
			t.Errorf("%s %s Berlin: size %d, want %d", c.day, c.hm, got, c.want)
		}
	}
	if got := api.PoolSize(model.Pool{Size: 4}, time.Now()); got != 4 {
		t.Errorf("no schedule: %d, want 4", got)
	}
}

func TestPoolScheduleRefused(t *testing.T) {
	for _, c := range []struct {
		w    model.PoolWindow
		tz   string
		want string
	}{
		{model.PoolWindow{Days: "someday", From: "08:00", To: "09:00"}, "", "unknown day"},
		{model.PoolWindow{Days: "mon", From: "8", To: "09:00"}, "", "HH:MM"},
		{model.PoolWindow{Days: "mon", From: "08:00", To: "24:00"}, "", "HH:MM"},
		{model.PoolWindow{Days: "mon", From: "08:00", To: "09:00", Size: 51}, "", "size 51"},
		{model.PoolWindow{Days: "mon", From: "08:00", To: "09:00"}, "Mars/Olympus", "timeZone"},
	} {
		p := api.PoolSetParams{TemplateID: "t", Size: 1, Schedule: []model.PoolWindow{c.w}, TimeZone: c.tz}
		if err := p.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v %q: %v, want %q", c.w, c.tz, err, c.want)
		}
	}
	if w, err := api.ParsePoolWindow("weekdays 08:00-18:00=5"); err != nil || w != (model.PoolWindow{Days: "weekdays", From: "08:00", To: "18:00", Size: 5}) {
		t.Errorf("ParsePoolWindow: %+v %v", w, err)
	}
	for _, bad := range []string{"weekdays 08:00-18:00", "08:00-18:00=5", "weekdays 08:00=5", "weekdays 08:00-18:00=x"} {
		if _, err := api.ParsePoolWindow(bad); err == nil {
			t.Errorf("ParsePoolWindow(%q) accepted", bad)
		}
	}
}
