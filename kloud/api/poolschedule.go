package api

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/kloud-dev/kloud/kloud/model"
)

// A pool's schedule (model.PoolWindow): its size by the time of day and week, e.g. 5 on working
// days from 08:00 to 18:00 and 1 otherwise, for a team that starts its day at once.

// MaxPoolWindows bounds a pool's schedule.
const MaxPoolWindows = 16

// poolWindow parses a window into its days and its start and end (minutes after midnight),
// with autostart's syntax (ParseSchedule): DAYS is "daily", "weekdays", a day, a range or a list.
func poolWindow(w model.PoolWindow) (days [7]bool, from, to int, err error) {
	a, err := ParseSchedule(w.Days + " " + w.From)
	if err != nil {
		return days, 0, 0, fmt.Errorf("window %q %s-%s: %w", w.Days, w.From, w.To, err)
	}
	b, err := ParseSchedule(w.Days + " " + w.To)
	if err != nil {
		return days, 0, 0, fmt.Errorf("window %q %s-%s: %w", w.Days, w.From, w.To, err)
	}
	return a.Days, a.Hour*60 + a.Minute, b.Hour*60 + b.Minute, nil
}

// ValidatePoolSchedule checks a schedule and its time zone.
func ValidatePoolSchedule(ws []model.PoolWindow, tz string) error {
	var errs []error
	if len(ws) > MaxPoolWindows {
		errs = append(errs, fmt.Errorf("schedule: %d windows, at most %d", len(ws), MaxPoolWindows))
	}
	for i, w := range ws {
		if _, _, _, err := poolWindow(w); err != nil {
			errs = append(errs, fmt.Errorf("schedule[%d]: %w", i, err))
		}
		if w.Size < 0 || w.Size > MaxPoolSize {
			errs = append(errs, fmt.Errorf("schedule[%d]: size %d: want 0 to %d", i, w.Size, MaxPoolSize))
		}
	}
	if tz != "" {
		if _, err := time.LoadLocation(tz); err != nil {
			errs = append(errs, fmt.Errorf("timeZone %q: %w", tz, err))
		}
	}
	return errors.Join(errs...)
}

// PoolSize is pool p's size at now: the size of the first window of its schedule that holds now
// (in its time zone), else p.Size. A window whose To is at or before its From runs past
// midnight into the next day.
func PoolSize(p model.Pool, now time.Time) int {
	loc := time.UTC
	if p.TimeZone != "" {
		if l, err := time.LoadLocation(p.TimeZone); err == nil {
			loc = l
		}
	}
	t := now.In(loc)
	minute := t.Hour()*60 + t.Minute()
	for _, w := range p.Schedule {
		days, from, to, err := poolWindow(w)
		if err != nil {
			continue
		}
		today, yesterday := t.Weekday(), (t.Weekday()+6)%7
		switch {
		case from < to && days[today] && minute >= from && minute < to:
			return w.Size
		case from >= to && days[today] && minute >= from: // the evening of its day
			return w.Size
		case from >= to && days[yesterday] && minute < to: // the morning after
			return w.Size
		}
	}
	return p.Size
}

// ParsePoolWindow parses the CLI's form of a window: "DAYS HH:MM-HH:MM=SIZE", e.g.
// "weekdays 08:00-18:00=5" (DAYS as autostart's: daily, weekdays, mon, mon-fri, sat,sun).
func ParsePoolWindow(s string) (model.PoolWindow, error) {
	days, rest, ok1 := strings.Cut(strings.TrimSpace(s), " ")
	span, size, ok2 := strings.Cut(strings.TrimSpace(rest), "=")
	from, to, ok3 := strings.Cut(span, "-")
	n, err := strconv.Atoi(strings.TrimSpace(size))
	if !ok1 || !ok2 || !ok3 || err != nil {
		return model.PoolWindow{}, fmt.Errorf("schedule window %q: want DAYS HH:MM-HH:MM=SIZE (weekdays 08:00-18:00=5)", s)
	}
	w := model.PoolWindow{Days: days, From: strings.TrimSpace(from), To: strings.TrimSpace(to), Size: n}
	if err := ValidatePoolSchedule([]model.PoolWindow{w}, ""); err != nil {
		return w, err
	}
	return w, nil
}
