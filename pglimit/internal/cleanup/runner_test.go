package cleanup_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit/internal/cleanup"
	"github.com/pglimit/cooldown/pglimit/internal/leadership"
)

// leader returns an elector on a lock of its own, once it leads.
func leader(t *testing.T) *leadership.Elector {
	t.Helper()
	pool := testdb.Pool(t)
	e := leadership.New(leadership.Config{
		Acquire:  func(ctx context.Context) (*pgx.Conn, error) { c, err := pool.Acquire(ctx); return hijack(c, err) },
		Key:      time.Now().UnixNano(),
		Interval: 20 * time.Millisecond,
		Logger:   slog.New(slog.DiscardHandler),
	})
	e.Start()
	t.Cleanup(func() { e.Stop(context.Background()) })
	for deadline := time.Now().Add(30 * time.Second); !e.Leader(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the elector never led")
		}
	}
	return e
}

func hijack(c *pgxpool.Conn, err error) (*pgx.Conn, error) {
	if err != nil {
		return nil, err
	}
	return c.Hijack(), nil
}

// A run deletes, batch after batch, the rows whose limits ended more than
// the retention ago and no others, counts what it did, and runs no batch
// once the cleaner is stopping.
func TestRunnerRun(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, schema := testdb.Pool(t), testdb.Schema(t)
	seed := "INSERT INTO " + pgx.Identifier{schema, "pglimit_range"}.Sanitize() + ` (namespace, key, during)
SELECT 'n', $3 || g, tstzrange(now() - interval '2 hours', now() + $1::interval) FROM generate_series(1, $2) AS g`
	if _, err := pool.Exec(ctx, seed, "-1 hour", 25, "ended-"); err != nil { // ended an hour ago
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, seed, "1 hour", 5, "live-"); err != nil {
		t.Fatal(err)
	}
	table, err := cleanup.Describe(ctx, pool, schema, "pglimit_range")
	if err != nil {
		t.Fatal(err)
	}
	var batches []int64
	stopping := make(chan struct{})
	r := &cleanup.Runner{
		Elector: leader(t), Retention: time.Minute, BatchSize: 10, BatchTimeout: 5 * time.Second,
		Logger: slog.New(slog.NewTextHandler(t.Output(), nil)), Stopping: stopping,
		Hooks: &cleanup.Hooks{BatchEnd: func(_ string, rows int64, err error) {
			if err != nil {
				t.Errorf("batch: %v", err)
			}
			batches = append(batches, rows)
		}},
	}
	r.Run(ctx, []cleanup.Table{table})
	if want := []int64{10, 10, 5}; len(batches) != len(want) || batches[0] != 10 || batches[1] != 10 || batches[2] != 5 {
		t.Errorf("batches deleted %v, want %v", batches, want)
	}
	var left int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{schema, "pglimit_range"}.Sanitize()).Scan(&left); err != nil || left != 5 {
		t.Errorf("%d rows left (%v), want the 5 live ones", left, err)
	}
	if r.Runs.Load() != 1 || r.Batches.Load() != 3 || r.RowsDeleted.Load() != 25 || r.Errors.Load() != 0 || r.LastSuccess.Load() == 0 {
		t.Errorf("counts: runs %d, batches %d, rows %d, errors %d, last success %d",
			r.Runs.Load(), r.Batches.Load(), r.RowsDeleted.Load(), r.Errors.Load(), r.LastSuccess.Load())
	}

	close(stopping)
	batches = nil
	r.Run(ctx, []cleanup.Table{table})
	if len(batches) != 0 || r.Runs.Load() != 1 {
		t.Errorf("a stopping runner ran %d batches (runs %d)", len(batches), r.Runs.Load())
	}
}
