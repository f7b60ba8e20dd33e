package pglimit

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/pglimit/cooldown/pglimit/internal/arith"
	"github.com/pglimit/cooldown/pglimit/internal/pgtx"
	"github.com/pglimit/cooldown/pglimit/internal/queries"
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
	if l.TimeZone == "Local" {
		// Go's name for the process's own zone, which PostgreSQL does not
		// know: every decision would fail.
		return l, fmt.Errorf("%w: %s \"Local\" is Go's name for the local zone, unknown to PostgreSQL: name the zone", ErrInvalidConfig, field("TimeZone"))
	}
	loc, err := time.LoadLocation(l.TimeZone)
	if err != nil {
		return l, fmt.Errorf("%w: %s: %w (Go needs the zone too: install tzdata, or import time/tzdata)", ErrInvalidConfig, field("TimeZone"), err)
	}
	l.Period, l.loc = nominal, loc
	return l, nil
}

// zonesKnownSQL checks that the database knows zones (internal/queries).
var zonesKnownSQL = queries.Static("zones.known")

// calendarZones returns the zones of limits' calendar windows.
func calendarZones(limits []Limit) []string {
	var zones []string
	for _, l := range limits {
		if l.Calendar != "" && !slices.Contains(zones, l.TimeZone) {
			zones = append(zones, l.TimeZone)
		}
	}
	return zones
}

// unknownZone returns err, from a decision's statement on limits, as
// ErrInvalidConfig when it says that the database does not know a Calendar
// window's zone (SQLSTATE 22023, date_trunc's: the only statement part
// that raises it), a zone Go knew when the limiter was made.
func unknownZone(limits []Limit, err error) error {
	if pgtx.Code(err) != pgtx.CodeInvalidParameterValue {
		return err
	}
	zones := calendarZones(limits)
	if len(zones) == 0 {
		return err
	}
	return fmt.Errorf("%w: the database does not know the time zone of a Calendar window (%s): %w", ErrInvalidConfig, strings.Join(zones, ", "), err)
}
