package arith

import (
	"fmt"
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

var units = map[string]calendarUnit{
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

// Calendar is a FixedWindow's alignment to the calendar: a unit (minute,
// hour, day, week, month or year) in an IANA zone.
type Calendar struct {
	Unit string
	Zone string         // its name, which the SQL gives the database
	Loc  *time.Location // the same zone, for Go
}

// Nominal returns the nominal length of unit, and whether unit is one.
func Nominal(unit string) (time.Duration, bool) {
	u, ok := units[unit]
	return u.nominal, ok
}

// Slack returns a span longer than any window of unit.
func Slack(unit string) time.Duration { return units[unit].slack }

// Window returns the start and end, in µs since the epoch, of c's window
// that holds now (µs since the epoch).
func (c *Calendar) Window(now int64) (start, end int64) {
	u := units[c.Unit]
	s := u.trunc(time.UnixMicro(now).In(c.Loc))
	e := u.trunc(s.Add(u.slack))
	return s.UnixMicro(), e.UnixMicro()
}

// WindowSQL is the SQL of c's window that holds now (a bigint expression
// of µs since the epoch): its start and end in µs. The zone's rules are
// the database's.
func (c *Calendar) WindowSQL(now string) (start, end string) {
	ts := func(us string) string {
		return fmt.Sprintf("(timestamptz 'epoch' + (%s) * interval '1 microsecond')", us)
	}
	us := func(t string) string { return fmt.Sprintf("(extract(epoch FROM %s) * 1000000)::bigint", t) }
	u := units[c.Unit]
	start = us(fmt.Sprintf("date_trunc('%s', %s, '%s')", c.Unit, ts(now), c.Zone))
	end = us(fmt.Sprintf("date_trunc('%s', %s + interval '%d seconds', '%s')", c.Unit, ts(start), int64(u.slack/time.Second), c.Zone))
	return start, end
}
