package pglimit_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/pglimit"
)

// errTooSoon is what exportReport returns when the limiter refuses.
var errTooSoon = errors.New("too soon")

// exportReport runs work in a transaction that also takes the limiter's
// decision, so that the cooldown counts only if the export is committed.
func exportReport(ctx context.Context, pool *pgxpool.Pool, lim pglimit.Limiter, userID string, work func(pgx.Tx) error) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) // a no-op once committed
	d, err := lim.AllowTx(ctx, tx, userID)
	if err != nil {
		return err
	}
	if !d.Allowed {
		return errTooSoon // d.RetryAfter says how long
	}
	if err := work(tx); err != nil {
		return err // rolled back: the user may try again at once
	}
	return tx.Commit(ctx)
}

// A decision inside the caller's transaction: the first export fails and
// rolls back, so it does not count; the second is committed, and the third
// is too soon.
func ExampleLimiter_AllowTx() {
	ctx := context.Background()
	pool := migratedPool(ctx) // as in the package example
	defer pool.Close()
	lim, err := pglimit.New(pool, &pglimit.Config{Namespace: "export-tx", Cooldown: time.Hour})
	if err != nil {
		panic(err)
	}
	defer lim.Reset(ctx, "user-7")

	failing := func(pgx.Tx) error { return errors.New("disk full") }
	working := func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "SELECT 1") // the export's own statements
		return err
	}
	fmt.Println("first:", exportReport(ctx, pool, lim, "user-7", failing))
	fmt.Println("second:", exportReport(ctx, pool, lim, "user-7", working))
	fmt.Println("third:", exportReport(ctx, pool, lim, "user-7", working))
	// Output:
	// first: disk full
	// second: <nil>
	// third: too soon
}
