package pglimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
)

// rowTables names the table each strategy with a key row decides on.
var rowTables = map[pglimit.Strategy]string{pglimit.Upsert: "pglimit_upsert", pglimit.NoWait: "pglimit_nowait"}

// A decision whose key's row a concurrent transaction deletes (a Reset, a
// cleanup) after the decision's snapshot waits for that transaction, then
// decides on the clock read after it: the cooldown it writes never starts
// before the wait ended, and the placeholder its statement writes when the
// row is gone is never an answer nor left behind. NoWait gives up after
// its patience instead, and then writes nothing.
func TestDeletedRowDecidedAfterTheWait(t *testing.T) {
	t.Parallel()
	for s, name := range rowTables {
		t.Run(string(s), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			const cooldown = time.Hour
			pool, table, lim := endedCooldown(t, s, name, cooldown)

			deleter, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = deleter.Rollback(ctx) }()
			if _, err := deleter.Exec(ctx, "DELETE FROM "+table); err != nil {
				t.Fatal(err)
			}
			type result struct {
				d   pglimit.Decision
				err error
			}
			done := make(chan result, 1)
			go func() {
				d, err := lim.Allow(ctx, "k")
				done <- result{d, err}
			}()
			if s == pglimit.Upsert {
				testdb.WaitsForLock(t, pool, table, 10*time.Second)
			}
			time.Sleep(200 * time.Millisecond) // a wait long enough to tell its two ends apart
			var committing time.Time
			if err := deleter.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&committing); err != nil {
				t.Fatal(err)
			}
			if err := deleter.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			r := <-done
			if r.err != nil {
				t.Fatalf("the decision that waited: %v", r.err)
			}
			var rows, placeholders int
			var tat *time.Time
			if err := pool.QueryRow(ctx, "SELECT count(*), count(*) FILTER (WHERE expires_at = 'epoch'), max(expires_at) FROM "+table).Scan(&rows, &placeholders, &tat); err != nil {
				t.Fatal(err)
			}
			if !r.d.Allowed {
				if s == pglimit.Upsert || rows != 0 {
					t.Fatalf("refused (%+v), with %d rows left: want Upsert to admit, NoWait to refuse and write nothing", r.d, rows)
				}
				return
			}
			if rows != 1 || placeholders != 0 {
				t.Fatalf("admitted, and the table holds %d rows, %d of them placeholders: want the admission's row alone", rows, placeholders)
			}
			if start := tat.Add(-cooldown); start.Before(committing) {
				t.Errorf("the admission's cooldown starts at %s, %s before the deleter committed: a time from before its wait",
					start.Format(time.RFC3339Nano), committing.Sub(start))
			}
		})
	}
}

// A decision in a caller's REPEATABLE READ transaction, whose snapshot
// still holds a key's row that a Reset has since deleted, decides without
// an error, once, and leaves the key's one row: the row it admits on, not
// the placeholder its statement writes on the way.
func TestDeletedRowInRepeatableRead(t *testing.T) {
	t.Parallel()
	for s, name := range rowTables {
		t.Run(string(s), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool, table, lim := endedCooldown(t, s, name, time.Hour)
			tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(ctx) }()
			var seen int
			if err := tx.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&seen); err != nil || seen != 1 {
				t.Fatalf("the transaction's snapshot: %d rows, %v", seen, err)
			}
			if err := lim.Reset(ctx, "k"); err != nil {
				t.Fatal(err)
			}
			d, err := lim.AllowTx(ctx, tx, "k")
			if err != nil {
				t.Fatalf("AllowTx after a Reset its snapshot does not see: %v", err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			var rows, placeholders int
			if err := pool.QueryRow(ctx, "SELECT count(*), count(*) FILTER (WHERE expires_at = 'epoch') FROM "+table).Scan(&rows, &placeholders); err != nil {
				t.Fatal(err)
			}
			if want := map[bool]int{true: 1, false: 0}[d.Allowed]; rows != want || placeholders != 0 {
				t.Errorf("AllowTx answered %+v; the table holds %d rows, %d of them placeholders: want %d and none", d, rows, placeholders, want)
			}
		})
	}
}

// endedCooldown makes a limiter of strategy s on its table, name, in a
// schema of its own, admits key "k" and then ends its cooldown, so that
// the next request fits the key's row. It returns the pool, the table
// (schema-qualified) and the limiter.
func endedCooldown(t *testing.T, s pglimit.Strategy, name string, cooldown time.Duration) (*pgxpool.Pool, string, pglimit.Limiter) {
	t.Helper()
	ctx := context.Background()
	pool := testdb.Pool(t)
	schema := testdb.Schema(t)
	table := pgx.Identifier{schema, name}.Sanitize()
	lim := testdb.Limiter(t, pool, &pglimit.Config{Strategy: s, Schema: schema, Cooldown: cooldown, Timeout: 10 * time.Second})
	if d, err := lim.Allow(ctx, "k"); err != nil || !d.Allowed {
		t.Fatalf("first request: %+v, %v", d, err)
	}
	if _, err := pool.Exec(ctx, "UPDATE "+table+" SET expires_at = clock_timestamp() - interval '1 hour'"); err != nil {
		t.Fatal(err)
	}
	return pool, table, lim
}
