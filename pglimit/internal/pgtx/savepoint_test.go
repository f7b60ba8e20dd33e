package pgtx_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit/internal/pgtx"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// stepsOnly hides a pgx.Tx's pipelining, as a database/sql transaction
// has none: InSavepoint then takes its three round trips.
type stepsOnly struct{ pgtx.DB }

// The statement runs under the given lock_timeout, in a savepoint whose
// end restores the caller's own; a statement the server refuses rolls the
// savepoint back and leaves the transaction usable. Both ways: pipelined
// on a pgx.Tx, and in steps on any other transaction.
func TestInSavepoint(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	for name, wrap := range map[string]func(pgx.Tx) pgtx.DB{
		"pipelined": func(tx pgx.Tx) pgtx.DB { return tx },
		"steps":     func(tx pgx.Tx) pgtx.DB { return stepsOnly{tx} },
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '7s'"); err != nil {
				t.Fatal(err)
			}
			db := wrap(tx)
			var inside string
			err = pgtx.InSavepoint(ctx, db, 1500*time.Microsecond, "SELECT current_setting('lock_timeout')", nil,
				func(row pgx.Row) error { return row.Scan(&inside) })
			if err != nil || inside != "2ms" {
				t.Fatalf("inside: lock_timeout %q, %v; want 2ms (1.5ms rounded up)", inside, err)
			}
			var after string
			if err := tx.QueryRow(ctx, "SELECT current_setting('lock_timeout')").Scan(&after); err != nil || after != "7s" {
				t.Fatalf("after: lock_timeout %q, %v; want the caller's 7s", after, err)
			}

			err = pgtx.InSavepoint(ctx, db, time.Second, "SELECT 1 / 0", nil, func(row pgx.Row) error {
				var n int
				return row.Scan(&n)
			})
			if code := pgtx.Code(err); code != "22012" {
				t.Fatalf("division by zero: %v (SQLSTATE %q), want 22012", err, code)
			}
			var one int
			if err := tx.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
				t.Fatalf("the transaction is not usable after a refused statement: %v", err)
			}
			if err := tx.QueryRow(ctx, "SELECT current_setting('lock_timeout')").Scan(&after); err != nil || after != "7s" {
				t.Fatalf("after a refused statement: lock_timeout %q, %v; want 7s", after, err)
			}
		})
	}
}

// A statement the server cancels before it runs, while preparing it (here
// waiting for a table another session locks, past statement_timeout),
// leaves the transaction usable too: the savepoint is taken before
// anything is prepared.
func TestInSavepointRefusedPrepare(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	table := pgx.Identifier{testdb.Schema(t), "pglimit_slots"}.Sanitize()
	locker, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Rollback(ctx)
	if _, err := locker.Exec(ctx, "LOCK TABLE "+table+" IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	for name, wrap := range map[string]func(pgx.Tx) pgtx.DB{
		"pipelined": func(tx pgx.Tx) pgtx.DB { return tx },
		"steps":     func(tx pgx.Tx) pgtx.DB { return stepsOnly{tx} },
	} {
		t.Run(name, func(t *testing.T) {
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			if _, err := tx.Exec(ctx, "SET LOCAL statement_timeout = '200ms'"); err != nil {
				t.Fatal(err)
			}
			err = pgtx.InSavepoint(ctx, wrap(tx), 5*time.Second, "SELECT count(*) FROM "+table+" WHERE slot = $1", []any{1},
				func(row pgx.Row) error {
					var n int
					return row.Scan(&n)
				})
			if code := pgtx.Code(err); code != pgtx.CodeQueryCanceled || !pgtx.ServerTimeout(err) {
				t.Fatalf("%v (SQLSTATE %q), want 57014", err, code)
			}
			var one int
			if err := tx.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
				t.Fatalf("the transaction is not usable after the refused prepare: %v", err)
			}
		})
	}
}

// roundTrips counts what a connection sends apart from pipelines: each
// query, and each prepare that reached the server.
type roundTrips struct{ queries, prepares, batches atomic.Int64 }

func (r *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	r.queries.Add(1)
	return ctx
}
func (r *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (r *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	r.batches.Add(1)
	return ctx
}
func (r *roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (r *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}
func (r *roundTrips) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	return ctx
}
func (r *roundTrips) TracePrepareEnd(_ context.Context, _ *pgx.Conn, d pgx.TracePrepareEndData) {
	if !d.AlreadyPrepared {
		r.prepares.Add(1)
	}
}

// On a pgx transaction, a statement is prepared once per connection,
// inside its savepoint; from then on the savepoint, the statement and
// their undoing are one pipeline: one round trip.
func TestInSavepointOneRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(testdb.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	var rt roundTrips
	cfg.Tracer = &rt
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	for i := range 3 {
		before := [3]int64{rt.queries.Load(), rt.prepares.Load(), rt.batches.Load()}
		var n int
		var lock, statement string
		err := pgtx.InSavepoint(ctx, tx, time.Second, "SELECT $1::int + 1, current_setting('lock_timeout'), current_setting('statement_timeout')", []any{i},
			func(row pgx.Row) error { return row.Scan(&n, &lock, &statement) })
		if err != nil || n != i+1 || lock != "1s" || statement != "1s" {
			t.Fatalf("decision %d: %d under lock_timeout %q and statement_timeout %q, %v; want %d under 1s and 1s", i, n, lock, statement, err, i+1)
		}
		got := [3]int64{rt.queries.Load() - before[0], rt.prepares.Load() - before[1], rt.batches.Load() - before[2]}
		want := [3]int64{0, 0, 1} // a pipeline alone
		if i == 0 {
			want = [3]int64{1, 1, 1} // the savepoint, the prepare, the pipeline
		}
		if got != want {
			t.Errorf("decision %d: %d queries, %d prepares, %d pipelines; want %v", i, got[0], got[1], got[2], want)
		}
	}
}
