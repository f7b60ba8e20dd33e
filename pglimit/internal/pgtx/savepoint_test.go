package pgtx_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/cooldown/internal/testdb"
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
