package pglimit_test

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
)

func calendarConfig(unit, zone string, rate int) *pglimit.Config {
	return &pglimit.Config{Limits: []pglimit.Limit{{Name: "calendar", Rate: rate, Algorithm: pglimit.FixedWindow, Calendar: unit, TimeZone: zone}}}
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
		"Go's Local":        {Rate: 1, Algorithm: pglimit.FixedWindow, Calendar: "day", TimeZone: "Local"},
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

// childZone, set in a child process of TestCalendarZoneUnknownToServer,
// names the zone the child decides in.
const childZone = "PGLIMIT_TEST_CHILD_ZONE"

// A zone Go knows and the database does not makes every decision fail
// with ErrInvalidConfig naming the zone, not a bare SQLSTATE 22023. Go
// learns the zone from ZONEINFO, which it reads once per process, so the
// test runs its decision in a child process of its own binary.
func TestCalendarZoneUnknownToServer(t *testing.T) {
	if zone := os.Getenv(childZone); zone != "" {
		ctx := context.Background()
		cfg := calendarConfig("day", zone, 5)
		cfg.Schema = testdb.Schema(t)
		pool := testdb.Pool(t)
		lim := newLimiterOn(t, pool, *cfg)
		calls := map[string]func() (pglimit.Decision, error){
			"Allow":       func() (pglimit.Decision, error) { return lim.Allow(ctx, "k") },
			"AllowN":      func() (pglimit.Decision, error) { return lim.AllowN(ctx, "k", 2) },
			"AllowAtMost": func() (pglimit.Decision, error) { return lim.AllowAtMost(ctx, "k", 2) },
			"Peek":        func() (pglimit.Decision, error) { return lim.Peek(ctx, "k", 1) },
			"AllowTxN": func() (pglimit.Decision, error) {
				tx, err := pool.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Commit(ctx) //nolint:errcheck // what it committed is checked below
				return lim.AllowTxN(ctx, tx, "k", 2)
			},
		}
		for name, call := range calls {
			if d, err := call(); !errors.Is(err, pglimit.ErrInvalidConfig) || !strings.Contains(err.Error(), zone) {
				t.Errorf("%s in a zone the database does not know: %+v, %v; want ErrInvalidConfig naming %s", name, d, err, zone)
			}
		}
		var rows int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{cfg.Schema, "pglimit_upsert"}.Sanitize()).Scan(&rows); err != nil || rows != 0 {
			t.Errorf("the calls left %d rows (%v), want none", rows, err)
		}
		return
	}
	t.Parallel()
	// A TZif file of one zone, UTC+0 named "NWH", no transitions.
	dir := t.TempDir()
	tzif := append([]byte("TZif"), make([]byte, 16)...)
	for _, n := range []uint32{0, 0, 0, 0, 1, 4} { // isut, isstd, leap, time, type and char counts
		tzif = binary.BigEndian.AppendUint32(tzif, n)
	}
	tzif = append(tzif, 0, 0, 0, 0, 0, 0, 'N', 'W', 'H', 0)
	if err := os.MkdirAll(filepath.Join(dir, "Pglimit"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "Pglimit", "Nowhere"), tzif, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestCalendarZoneUnknownToServer$", "-test.count=1")
	cmd.Env = append(os.Environ(), "ZONEINFO="+dir, childZone+"=Pglimit/Nowhere", testdb.EnvURL+"="+testdb.URL(t))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the child process: %v\n%s", err, out)
	}
}
