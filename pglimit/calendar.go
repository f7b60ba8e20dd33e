package pglimit

import (
	"fmt"
	"regexp"
	"time"
)

// calendarUnit is a calendar window of [Limit.Calendar]: its nominal
// length (the Limit's Period, which headers report), and a span that, added
// to a window's start, always lands in the next window, whose start
// truncation then finds. Days last 23 to 25 hours, weeks 167 to 169, months
// 28 to 31 days, years 365 or 366.
type calendarUnit struct {
	nominal, slack time.Duration
	// trunc is the start of the window holding t, in t's location.
	trunc func(t time.Time) time.Time
}

var calendarUnits = map[string]calendarUnit{
	"minute": {time.Minute, 90 * time.Second, func(t time.Time) time.Time {
		return time.Date(t.Year(), t.Month(), t.Day(), t.Hour(), t.Minute(), 0, 0, t.Location())
	}},
	"hour": {time.Hour, 90 * time.Minute, func(t time.Time) time.Time {
		return time.Date(t.Year(), t.Month(), t.Day(), t.Hour(), 0, 0, 0, t.Location())
	}},
	"day": {24 * time.Hour, 26 * time.Hour, func(t time.Time) time.Time {
		return time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, t.Location())
	}},
	"week": {7 * 24 * time.Hour, 7*24*time.Hour + 2*time.Hour, func(t time.Time) time.Time {
		// ISO weeks start on Monday, as PostgreSQL's date_trunc('week').
		return time.Date(t.Year(), t.Month(), t.Day()-(int(t.Weekday())+6)%7, 0, 0, 0, 0, t.Location())
	}},
	"month": {30 * 24 * time.Hour, 32 * 24 * time.Hour, func(t time.Time) time.Time {
		return time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, t.Location())
	}},
	"year": {365 * 24 * time.Hour, 367 * 24 * time.Hour, func(t time.Time) time.Time {
		return time.Date(t.Year(), 1, 1, 0, 0, 0, 0, t.Location())
	}},
}

// zoneName is the shape of an IANA zone name; it keeps the name safe to
// write into a statement as a literal.
var zoneName = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_+\-]*(/[A-Za-z0-9_+\-]+)*$`)

// withCalendar validates l's calendar window and fills in its Period, and
// its zone, defaulting to UTC.
func (l Limit) withCalendar(field func(string) string) (Limit, error) {
	u, ok := calendarUnits[l.Calendar]
	switch {
	case !ok:
		return l, fmt.Errorf("%w: %s is %q, not one of minute, hour, day, week, month, year", ErrInvalidConfig, field("Calendar"), l.Calendar)
	case l.Algorithm != FixedWindow:
		return l, fmt.Errorf("%w: %s applies to FixedWindow, not %s", ErrInvalidConfig, field("Calendar"), l.Algorithm)
	case l.Period != 0:
		return l, fmt.Errorf("%w: %s must be zero with a Calendar: the calendar sets the windows", ErrInvalidConfig, field("Period"))
	}
	if l.TimeZone == "" {
		l.TimeZone = "UTC"
	}
	if !zoneName.MatchString(l.TimeZone) || len(l.TimeZone) > 64 {
		return l, fmt.Errorf("%w: %s %q is not an IANA zone name", ErrInvalidConfig, field("TimeZone"), l.TimeZone)
	}
	loc, err := time.LoadLocation(l.TimeZone)
	if err != nil {
		return l, fmt.Errorf("%w: %s: %w (Go needs the zone too: install tzdata, or import time/tzdata)", ErrInvalidConfig, field("TimeZone"), err)
	}
	l.Period, l.loc = u.nominal, loc
	return l, nil
}

// window returns the start and end, in µs since the epoch, of l's calendar
// window that holds now (µs since the epoch).
func (l Limit) window(now int64) (start, end int64) {
	u := calendarUnits[l.Calendar]
	s := u.trunc(time.UnixMicro(now).In(l.loc))
	e := u.trunc(s.Add(u.slack))
	return s.UnixMicro(), e.UnixMicro()
}

// windowSQL is the SQL of l's calendar window that holds now (a bigint
// expression of µs since the epoch): its start and end in µs. The zone's
// rules are the database's.
func (l Limit) windowSQL(now string) (start, end string) {
	ts := func(us string) string {
		return fmt.Sprintf("(timestamptz 'epoch' + (%s) * interval '1 microsecond')", us)
	}
	us := func(t string) string { return fmt.Sprintf("(extract(epoch FROM %s) * 1000000)::bigint", t) }
	u := calendarUnits[l.Calendar]
	start = us(fmt.Sprintf("date_trunc('%s', %s, '%s')", l.Calendar, ts(now), l.TimeZone))
	end = us(fmt.Sprintf("date_trunc('%s', %s + interval '%d seconds', '%s')", l.Calendar, ts(start), int64(u.slack/time.Second), l.TimeZone))
	return start, end
}
