package pglimit_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimitclean"
)

var citusCleanTables = []string{"pglimit_upsert", "pglimit_nowait", "pglimit_range", "pglimit_upsert_unlogged", "pglimit_nowait_unlogged"}

// startCitusCleaners starts n cleaners of every limiter table of schema,
// each on a pool of its own, stopped (within a bound) when the test ends.
func startCitusCleaners(t *testing.T, schema string, n int, retention time.Duration) []*pglimitclean.Cleaner {
	t.Helper()
	var out []*pglimitclean.Cleaner
	for i := range n {
		c, err := pglimitclean.New(citusPool(t, 2), &pglimitclean.Config{
			Schema: schema, Tables: citusCleanTables, Interval: 50 * time.Millisecond,
			Retention: retention, BatchSize: 500,
			Logger: slog.New(slog.NewTextHandler(t.Output(), nil)).With("instance", i),
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			start := time.Now()
			if err := c.Stop(ctx); err != nil {
				t.Errorf("stop cleaner %d: %v", i, err)
			}
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("stop cleaner %d took %s", i, took)
			}
		})
		out = append(out, c)
	}
	return out
}

// On distributed tables the cleaners elect one leader on the coordinator,
// which deletes every expired row of every table, and no live one.
func TestCitusCleanerDeletesExpiredOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := citusPool(t, 4)
	schema := citusSchema(t, pool)
	const expired, live = 3000, 1000
	for _, table := range citusCleanTables {
		q := fmt.Sprintf(`INSERT INTO %s.%s (namespace, key, expires_at)
SELECT 'ns', 'k' || g, CASE WHEN g <= $1::int THEN now() - interval '1 hour' ELSE now() + interval '1 hour' END
FROM generate_series(1, $1::int + $2::int) g`, schema, table)
		if table == "pglimit_range" {
			q = fmt.Sprintf(`INSERT INTO %s.%s (namespace, key, during)
SELECT 'ns', 'k' || g, CASE WHEN g <= $1::int THEN tstzrange(now() - interval '2 hours', now() - interval '1 hour')
                            ELSE tstzrange(now() - interval '1 minute', now() + interval '1 hour') END
FROM generate_series(1, $1::int + $2::int) g`, schema, table)
		}
		if _, err := pool.Exec(ctx, q, expired, live); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	cleaners := startCitusCleaners(t, schema, 2, time.Nanosecond)
	want := uint64(expired * len(citusCleanTables))
	var total uint64
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		total = 0
		for _, c := range cleaners {
			total += c.Stats().RowsDeleted
		}
		if total >= want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 60s the cleaners deleted %d rows, want %d", total, want)
		}
	}
	took := time.Since(start)
	leaders, deleters := 0, 0
	var batches, errs uint64
	for _, c := range cleaners {
		s := c.Stats()
		if s.Leader {
			leaders++
		}
		if s.RowsDeleted > 0 {
			deleters++
		}
		batches += s.Batches
		errs += s.Errors
	}
	if leaders != 1 || deleters != 1 || total != want || errs != 0 {
		t.Fatalf("%d leaders, %d instances deleted, %d rows deleted (want %d), %d failed batches; want one leader that deleted every expired row",
			leaders, deleters, total, want, errs)
	}
	for _, table := range citusCleanTables {
		var n int
		if err := pool.QueryRow(ctx, fmt.Sprintf("SELECT count(*) FROM %s.%s", schema, table)).Scan(&n); err != nil || n != live {
			t.Fatalf("%s: %d rows left, %v; want the %d live ones", table, n, err, live)
		}
	}
	t.Logf("cleanup on Citus: %d expired rows of %d tables deleted in %s, %d batches of at most 500 keys, %d live rows kept per table",
		total, len(citusCleanTables), took.Round(time.Millisecond), batches, live)
}

// A cleaner deleting as soon as cooldowns end, while requests readmit the
// same keys, never deletes a live row: no key is admitted twice within its
// cooldown, judged by the database time of each admission.
func TestCitusCleanerNeverDeletesLiveRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := citusPool(t, 8)
	schema := citusSchema(t, pool)
	cleaner := startCitusCleaners(t, schema, 1, time.Nanosecond)[0]
	const cooldown = 200 * time.Millisecond
	for _, s := range pglimit.Strategies() {
		t.Run(string(s), func(t *testing.T) {
			lim, err := pglimit.New(pool, &pglimit.Config{Strategy: s, Schema: schema, Namespace: "live", Cooldown: cooldown})
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			admitted := map[string][]int64{}
			var wg sync.WaitGroup
			deadline := time.Now().Add(3 * time.Second)
			for w := range 8 {
				wg.Go(func() {
					for i := 0; time.Now().Before(deadline); i++ {
						key := fmt.Sprintf("k%d", (w+i)%20)
						d, err := lim.Allow(ctx, key)
						if err != nil {
							t.Error(err)
							return
						}
						if d.Allowed {
							mu.Lock()
							admitted[key] = append(admitted[key], pglimit.DecisionAt(d))
							mu.Unlock()
						}
					}
				})
			}
			wg.Wait()
			n := 0
			for key, ats := range admitted {
				slices.Sort(ats)
				n += len(ats)
				for i := 1; i < len(ats); i++ {
					if gap := time.Duration(ats[i]-ats[i-1]) * time.Microsecond; gap < cooldown {
						t.Errorf("%s admitted %s after its previous admission; cooldown %s", key, gap, cooldown)
					}
				}
			}
			if n < 40 {
				t.Fatalf("only %d admissions in 3s over 20 keys: the test did not exercise readmission", n)
			}
			t.Logf("%d admissions over 20 keys, none early; %d rows deleted so far", n, cleaner.Stats().RowsDeleted)
		})
	}
	if s := cleaner.Stats(); s.RowsDeleted == 0 || s.Errors != 0 {
		t.Fatalf("cleaner: %+v; want rows deleted meanwhile, and no failed batch", s)
	}
}
