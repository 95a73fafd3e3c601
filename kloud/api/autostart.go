package api

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// AutostartOff is the autostart param that drops a machine's schedule.
const AutostartOff = "off"

// Schedule is a parsed autostart schedule: the days of the week and the time of day.
type Schedule struct {
	Days         [7]bool // by time.Weekday
	Hour, Minute int
}

var weekdays = []string{"sun", "mon", "tue", "wed", "thu", "fri", "sat"}

func weekday(s string) (int, bool) {
	for i, d := range weekdays {
		if s == d {
			return i, true
		}
	}
	return 0, false
}

// ParseSchedule parses "DAYS HH:MM": DAYS is "daily", "weekdays", a day ("mon"), a range
// ("mon-fri") or a comma list of days and ranges ("mon,wed,fri-sat").
func ParseSchedule(v string) (Schedule, error) {
	var sc Schedule
	bad := func(why string) (Schedule, error) {
		return sc, fmt.Errorf(`autostart %q: %s; want "DAYS HH:MM", e.g. "mon-fri 09:00", "daily 08:30" or "sat,sun 10:00"`, v, why)
	}
	f := strings.Fields(strings.ToLower(v))
	if len(f) != 2 {
		return bad("two parts")
	}
	switch f[0] {
	case "daily":
		f[0] = "sun-sat"
	case "weekdays":
		f[0] = "mon-fri"
	}
	for _, part := range strings.Split(f[0], ",") {
		from, to, isRange := strings.Cut(part, "-")
		a, ok1 := weekday(from)
		b, ok2 := weekday(to)
		if !isRange {
			b, ok2 = a, ok1
		}
		if !ok1 || !ok2 {
			return bad(fmt.Sprintf("unknown day in %q (sun, mon, tue, wed, thu, fri, sat)", part))
		}
		for d := a; ; d = (d + 1) % 7 {
			sc.Days[d] = true
			if d == b {
				break
			}
		}
	}
	hh, mm, ok := strings.Cut(f[1], ":")
	h, err1 := strconv.Atoi(hh)
	m, err2 := strconv.Atoi(mm)
	if !ok || err1 != nil || err2 != nil || h < 0 || h > 23 || m < 0 || m > 59 || len(mm) != 2 {
		return bad(fmt.Sprintf("time %q is not HH:MM (00:00 to 23:59)", f[1]))
	}
	sc.Hour, sc.Minute = h, m
	return sc, nil
}

// Next is the first start of the schedule after t, in loc.
func (sc Schedule) Next(t time.Time, loc *time.Location) time.Time {
	lt := t.In(loc)
	for i := range 8 {
		d := lt.AddDate(0, 0, i)
		at := time.Date(d.Year(), d.Month(), d.Day(), sc.Hour, sc.Minute, 0, 0, loc)
		if sc.Days[at.Weekday()] && at.After(t) {
			return at.UTC()
		}
	}
	return time.Time{} // no day: ParseSchedule never gives one
}

// ParseAutostart validates machine.set's autostart and timezone params.
func ParseAutostart(schedule, tz string) (Schedule, *time.Location, error) {
	sc, err := ParseSchedule(schedule)
	if err != nil {
		return sc, nil, err
	}
	if tz == "" {
		tz = "UTC"
	}
	loc, err := time.LoadLocation(tz)
	if err != nil || tz == "Local" { // Local: kloud's host's zone, which nobody else knows
		return sc, nil, fmt.Errorf("timezone %q: want an IANA time zone such as Europe/Berlin or UTC", tz)
	}
	return sc, loc, nil
}
