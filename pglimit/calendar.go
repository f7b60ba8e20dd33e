package pglimit

import (
	"fmt"
	"regexp"
	"time"

	"github.com/pglimit/cooldown/pglimit/internal/arith"
)

// zoneName is the shape of an IANA zone name; it keeps the name safe to
// write into a statement as a literal.
var zoneName = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_+\-]*(/[A-Za-z0-9_+\-]+)*$`)

// withCalendar validates l's calendar window and fills in its Period, and
// its zone, defaulting to UTC.
func (l Limit) withCalendar(field func(string) string) (Limit, error) {
	nominal, ok := arith.Nominal(l.Calendar)
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
	l.Period, l.loc = nominal, loc
	return l, nil
}
