package pglimitprom_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit/pglimitclean"
	"github.com/pglimit/cooldown/pglimit/pglimitprom"
)

var cleanupMetrics = []string{
	"pglimit_cleanup_runs_total",
	"pglimit_cleanup_batches_total",
	"pglimit_cleanup_rows_deleted_total",
	"pglimit_cleanup_errors_total",
	"pglimit_cleanup_last_success_timestamp_seconds",
	"pglimit_cleanup_last_duration_seconds",
	"pglimit_cleanup_leader",
}

func TestCleanerCollector(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema, pool := testdb.Schema(t), testdb.Pool(t)
	const expired = 5
	_, err := pool.Exec(ctx, `INSERT INTO `+pgx.Identifier{schema, "pglimit_upsert"}.Sanitize()+` (namespace, key, expires_at)
		SELECT 'ns', 'expired-' || i, now() - interval '1 hour' FROM generate_series(1, $1) i
		UNION ALL SELECT 'ns', 'live', now() + interval '1 hour'`, expired)
	if err != nil {
		t.Fatal(err)
	}
	cleaner, err := pglimitclean.New(pool, &pglimitclean.Config{
		Schema:    schema,
		Interval:  20 * time.Millisecond,
		Retention: time.Minute,
		BatchSize: 2, // several batches per run
		Logger:    slog.New(slog.NewTextHandler(t.Output(), nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(pglimitprom.NewCleanerCollector(cleaner, schema))

	// Before any run every series is present, and at 0.
	for _, name := range cleanupMetrics {
		if got := value(t, reg, name, "cleaner", schema); got != 0 {
			t.Errorf("%s before Start = %v, want 0", name, got)
		}
	}

	started := time.Now()
	if err := cleaner.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer cleaner.Stop(ctx)
	deadline := time.Now().Add(30 * time.Second)
	for s := cleaner.Stats(); s.RowsDeleted < expired || s.LastSuccess.IsZero(); s = cleaner.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("no successful run deleting %d rows after 30s: %+v", expired, s)
		}
		time.Sleep(5 * time.Millisecond)
	}

	// Running: the lone cleaner leads, has deleted exactly the expired rows,
	// and keeps running, so the other counters only have lower bounds. The
	// last success may move on while the series are read, so its upper bound
	// is the clock after reading them.
	lastSuccess := value(t, reg, "pglimit_cleanup_last_success_timestamp_seconds", "cleaner", schema)
	if lo, hi := unixSeconds(started), unixSeconds(time.Now()); lastSuccess < lo || lastSuccess > hi {
		t.Errorf("pglimit_cleanup_last_success_timestamp_seconds = %v while running, want in [%v, %v]", lastSuccess, lo, hi)
	}
	for _, c := range []struct {
		name     string
		min, max float64
	}{
		{"pglimit_cleanup_leader", 1, 1},
		{"pglimit_cleanup_rows_deleted_total", expired, expired},
		{"pglimit_cleanup_errors_total", 0, 0},
		{"pglimit_cleanup_runs_total", 1, 1e9},
		{"pglimit_cleanup_batches_total", 3, 1e9}, // 2 + 2 + 1 rows
		{"pglimit_cleanup_last_duration_seconds", 1e-9, 30},
	} {
		if got := value(t, reg, c.name, "cleaner", schema); got < c.min || got > c.max {
			t.Errorf("%s = %v while running, want in [%v, %v]", c.name, got, c.min, c.max)
		}
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %+v", err, problems)
	}

	// Stopped: the numbers no longer move, so they must equal Stats exactly.
	if err := cleaner.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	s := cleaner.Stats()
	for name, want := range map[string]float64{
		"pglimit_cleanup_leader":                         0,
		"pglimit_cleanup_runs_total":                     float64(s.Runs),
		"pglimit_cleanup_batches_total":                  float64(s.Batches),
		"pglimit_cleanup_rows_deleted_total":             float64(s.RowsDeleted),
		"pglimit_cleanup_errors_total":                   float64(s.Errors),
		"pglimit_cleanup_last_duration_seconds":          s.LastDuration.Seconds(),
		"pglimit_cleanup_last_success_timestamp_seconds": unixSeconds(s.LastSuccess),
	} {
		if got := value(t, reg, name, "cleaner", schema); got != want {
			t.Errorf("%s = %v after Stop, want %v", name, got, want)
		}
	}
}

func unixSeconds(t time.Time) float64 { return float64(t.Unix()) + float64(t.Nanosecond())/1e9 }

// fakeCleaner reports fixed statistics.
type fakeCleaner pglimitclean.Stats

func (f fakeCleaner) Stats() pglimitclean.Stats { return pglimitclean.Stats(f) }

func TestCleanerCollectorExposition(t *testing.T) {
	t.Parallel()
	c := pglimitprom.NewCleanerCollector(fakeCleaner{
		Runs:         7,
		Batches:      9,
		RowsDeleted:  4321,
		Errors:       2,
		LastSuccess:  time.Unix(1_700_000_000, 250_000_000),
		LastDuration: 1500 * time.Millisecond,
		Leader:       true,
	}, "public")
	const want = `
# HELP pglimit_cleanup_batches_total Cleanup DELETE batches that committed.
# TYPE pglimit_cleanup_batches_total counter
pglimit_cleanup_batches_total{cleaner="public"} 9
# HELP pglimit_cleanup_errors_total Cleanup batches that failed; a failure ends its run.
# TYPE pglimit_cleanup_errors_total counter
pglimit_cleanup_errors_total{cleaner="public"} 2
# HELP pglimit_cleanup_last_duration_seconds How long the last finished cleanup run took; 0 before the first.
# TYPE pglimit_cleanup_last_duration_seconds gauge
pglimit_cleanup_last_duration_seconds{cleaner="public"} 1.5
# HELP pglimit_cleanup_last_success_timestamp_seconds Unix time at which the last cleanup run without error ended; 0 before the first.
# TYPE pglimit_cleanup_last_success_timestamp_seconds gauge
pglimit_cleanup_last_success_timestamp_seconds{cleaner="public"} 1.70000000025e+09
# HELP pglimit_cleanup_leader 1 while this instance leads the cleanup (only the leader deletes), else 0.
# TYPE pglimit_cleanup_leader gauge
pglimit_cleanup_leader{cleaner="public"} 1
# HELP pglimit_cleanup_rows_deleted_total Rows deleted by the cleanup, whose limits had ended more than the retention ago.
# TYPE pglimit_cleanup_rows_deleted_total counter
pglimit_cleanup_rows_deleted_total{cleaner="public"} 4321
# HELP pglimit_cleanup_runs_total Cleanup runs this instance started as leader.
# TYPE pglimit_cleanup_runs_total counter
pglimit_cleanup_runs_total{cleaner="public"} 7
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %+v", err, problems)
	}
}
