package arith_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit/internal/arith"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// The windows the database computes with its time zone data are the ones
// Go computes with its own, across daylight-saving changes, leap days and
// years, and in a zone whose clocks move by half an hour; and they have
// the lengths the calendar says.
func TestCalendarWindows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	at := func(zone string, y int, m time.Month, d, h, min int) time.Time {
		loc, err := time.LoadLocation(zone)
		if err != nil {
			t.Fatal(err)
		}
		return time.Date(y, m, d, h, min, 0, 0, loc)
	}
	for _, tc := range []struct {
		unit, zone string
		at         time.Time
		length     time.Duration
	}{
		{"day", "Europe/Paris", at("Europe/Paris", 2026, 3, 29, 12, 0), 23 * time.Hour},
		{"day", "Europe/Paris", at("Europe/Paris", 2026, 10, 25, 1, 30), 25 * time.Hour},
		{"day", "America/New_York", at("America/New_York", 2026, 11, 1, 23, 59), 25 * time.Hour},
		{"day", "Australia/Lord_Howe", at("Australia/Lord_Howe", 2026, 4, 5, 12, 0), 24*time.Hour + 30*time.Minute},
		{"day", "UTC", at("UTC", 2026, 6, 1, 0, 0), 24 * time.Hour},
		{"week", "Europe/Paris", at("Europe/Paris", 2026, 3, 26, 8, 0), 7*24*time.Hour - time.Hour},
		{"month", "Europe/Paris", at("Europe/Paris", 2028, 2, 15, 0, 0), 29 * 24 * time.Hour},
		{"month", "America/New_York", at("America/New_York", 2026, 3, 31, 23, 0), 31*24*time.Hour - time.Hour},
		{"year", "Asia/Tokyo", at("Asia/Tokyo", 2028, 7, 1, 0, 0), 366 * 24 * time.Hour},
		{"hour", "Asia/Kolkata", at("Asia/Kolkata", 2026, 1, 1, 10, 45), time.Hour},
		{"minute", "America/St_Johns", at("America/St_Johns", 2026, 1, 1, 10, 45), time.Minute},
	} {
		t.Run(fmt.Sprintf("%s/%s/%s", tc.unit, tc.zone, tc.at.Format(time.DateOnly)), func(t *testing.T) {
			cal := &arith.Calendar{Unit: tc.unit, Zone: tc.zone, Loc: tc.at.Location()}
			start, end := cal.Window(tc.at.UnixMicro())
			if got := time.Duration(end-start) * time.Microsecond; got != tc.length {
				t.Errorf("window %s to %s lasts %s, want %s", time.UnixMicro(start), time.UnixMicro(end), got, tc.length)
			}
			// The window's bounds, and instants just inside and outside.
			for _, now := range []int64{tc.at.UnixMicro(), start, start + 1, end - 1, end, start - 1} {
				goStart, goEnd := cal.Window(now)
				startSQL, endSQL := cal.WindowSQL("$1::bigint")
				var dbStart, dbEnd int64
				if err := pool.QueryRow(ctx, "SELECT "+startSQL+", "+endSQL, now).Scan(&dbStart, &dbEnd); err != nil {
					t.Fatal(err)
				}
				if dbStart != goStart || dbEnd != goEnd {
					t.Errorf("at %s: the database's window is [%s, %s), Go's [%s, %s)", time.UnixMicro(now),
						time.UnixMicro(dbStart), time.UnixMicro(dbEnd), time.UnixMicro(goStart), time.UnixMicro(goEnd))
				}
				if now < goStart || now >= goEnd {
					t.Errorf("at %s: the window [%s, %s) does not hold it", time.UnixMicro(now), time.UnixMicro(goStart), time.UnixMicro(goEnd))
				}
			}
		})
	}
}

// Each unit has a nominal length, and a slack longer than its longest
// window (a day of 25 hours, a month of 31 days and one hour), so that a
// window's start plus the slack lands in the next window; an unknown unit
// is none.
func TestUnits(t *testing.T) {
	const day = 24 * time.Hour
	for unit, tc := range map[string]struct{ nominal, longest time.Duration }{
		"minute": {time.Minute, time.Minute},
		"hour":   {time.Hour, time.Hour},
		"day":    {day, 25 * time.Hour},
		"week":   {7 * day, 7*day + time.Hour},
		"month":  {30 * day, 31*day + time.Hour},
		"year":   {365 * day, 366*day + time.Hour},
	} {
		got, ok := arith.Nominal(unit)
		if !ok || got != tc.nominal {
			t.Errorf("Nominal(%s) = %s, %t; want %s", unit, got, ok, tc.nominal)
		}
		if s := arith.Slack(unit); s <= tc.longest || s >= 2*tc.nominal {
			t.Errorf("Slack(%s) = %s, want past its longest window %s and short of two windows", unit, s, tc.longest)
		}
	}
	if _, ok := arith.Nominal("fortnight"); ok {
		t.Error("fortnight is a unit")
	}
}

// testSeed seeds the random tests; a failure names the sequence, and the
// seed is fixed so that it reproduces.
const testSeed = 20261124
