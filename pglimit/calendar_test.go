package pglimit_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/cooldown/internal/testdb"
	"github.com/pglimit/cooldown/pglimit"
)

func calendarConfig(unit, zone string, rate int) *pglimit.Config {
	return &pglimit.Config{Limits: []pglimit.Limit{{Name: "calendar", Rate: rate, Algorithm: pglimit.FixedWindow, Calendar: unit, TimeZone: zone}}}
}

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
			cfg := calendarConfig(tc.unit, tc.zone, 1)
			start, end, _, _, err := pglimit.CalendarWindow(cfg, 0, tc.at.UnixMicro())
			if err != nil {
				t.Fatal(err)
			}
			if got := time.Duration(end-start) * time.Microsecond; got != tc.length {
				t.Errorf("window %s to %s lasts %s, want %s", time.UnixMicro(start), time.UnixMicro(end), got, tc.length)
			}
			// The window's bounds, and instants just inside and outside.
			for _, now := range []int64{tc.at.UnixMicro(), start, start + 1, end - 1, end, start - 1} {
				goStart, goEnd, startSQL, endSQL, err := pglimit.CalendarWindow(cfg, 0, now)
				if err != nil {
					t.Fatal(err)
				}
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

// Concurrent requests from two instances on a calendar day: exactly the
// rate is admitted, a refusal waits until the zone's next midnight to the
// microsecond, and once the window is over (its end moved into the past
// here, as time would) the key starts a new one.
func TestCalendarDecisions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		t.Fatal(err)
	}
	schema := testdb.Schema(t)
	for _, s := range []pglimit.Strategy{pglimit.Upsert, pglimit.NoWait} {
		t.Run(string(s), func(t *testing.T) {
			t.Parallel()
			cfg := calendarConfig("day", "Europe/Paris", 5)
			cfg.Schema, cfg.Strategy, cfg.Namespace = schema, s, string(s)
			lims := []pglimit.Limiter{newLimiterOn(t, testdb.Pool(t), *cfg), newLimiterOn(t, testdb.Pool(t), *cfg)}
			var mu sync.Mutex
			var refusals []pglimit.Decision
			admitted := 0
			var wg sync.WaitGroup
			for i := range 20 {
				wg.Go(func() {
					d, err := lims[i%2].Allow(ctx, "k")
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					defer mu.Unlock()
					if d.Allowed {
						admitted++
					} else {
						refusals = append(refusals, d)
					}
				})
			}
			wg.Wait()
			if admitted != 5 {
				t.Fatalf("20 requests on a day of 5: %d admitted", admitted)
			}
			for _, d := range refusals {
				at := time.UnixMicro(pglimit.DecisionAt(d)).In(paris)
				midnight := time.Date(at.Year(), at.Month(), at.Day()+1, 0, 0, 0, 0, paris)
				if got := at.Add(d.RetryAfter); !got.Equal(midnight) || d.ResetAfter != d.RetryAfter {
					t.Fatalf("a refusal at %s waits until %s (reset %s), want Paris midnight %s", at, got, d.ResetAfter, midnight)
				}
			}
			// The day ends.
			table := pgx.Identifier{schema, "pglimit_" + string(s)}.Sanitize()
			if _, err := testdb.Pool(t).Exec(ctx, "UPDATE "+table+" SET state[3] = state[3] - 86400000000 * 2, state[1] = state[1] - 86400000000 * 2 WHERE namespace = $1", string(s)); err != nil {
				t.Fatal(err)
			}
			d, err := lims[0].Allow(ctx, "k")
			if err != nil || !d.Allowed || d.Remaining != 4 {
				t.Fatalf("the next day's first request: %+v, %v; want admitted with 4 left", d, err)
			}
		})
	}
}

// Calendar windows take a known unit and zone, on a FixedWindow alone.
func TestCalendarConfig(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	for name, l := range map[string]pglimit.Limit{
		"unknown unit":      {Rate: 1, Algorithm: pglimit.FixedWindow, Calendar: "fortnight"},
		"unknown zone":      {Rate: 1, Algorithm: pglimit.FixedWindow, Calendar: "day", TimeZone: "Mars/Olympus_Mons"},
		"a quote":           {Rate: 1, Algorithm: pglimit.FixedWindow, Calendar: "day", TimeZone: "UTC'; DROP TABLE x; --"},
		"GCRA":              {Rate: 1, Calendar: "day"},
		"sliding":           {Rate: 1, Algorithm: pglimit.SlidingWindow, Calendar: "day"},
		"a period as well":  {Rate: 1, Period: time.Hour, Algorithm: pglimit.FixedWindow, Calendar: "day"},
		"a zone, no window": {Rate: 1, Period: time.Hour, Algorithm: pglimit.FixedWindow, TimeZone: "Europe/Paris"},
	} {
		if _, err := pglimit.New(pool, &pglimit.Config{Limits: []pglimit.Limit{l}}); !errors.Is(err, pglimit.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
	lim, err := pglimit.New(pool, calendarConfig("month", "", 3))
	if err != nil {
		t.Fatal(err)
	}
	if l := lim.Policy().Limits[0]; l.TimeZone != "UTC" || l.Period != 30*24*time.Hour {
		t.Fatalf("defaults: %+v, want UTC and a nominal 30-day period", l)
	}
}
