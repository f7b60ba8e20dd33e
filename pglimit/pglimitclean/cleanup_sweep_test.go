package pglimitclean_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimitclean"
)

// A table without an index on expires_at (the Upsert and NoWait tables,
// durable and unlogged, since migration 00006) is cleaned by ranges of blocks:
// every ended row goes, every live row stays, and no batch deletes more
// than BatchSize rows.
func TestCleanerSweepsTablesWithoutTheIndex(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ table string }{
		{"pglimit_upsert_unlogged"},
		{"pglimit_upsert"},
	} {
		t.Run(tc.table, func(t *testing.T) {
			t.Parallel()
			f := newFleet(t, 0, nil)
			// Live rows between ended ones, over many blocks.
			f.seedKeys(t, tc.table, "a", 2000, "-1 hour")
			f.seedKeys(t, tc.table, "live", 300, "1 hour")
			f.seedKeys(t, tc.table, "b", 2000, "-1 hour")

			const batch = 100
			var most, batches atomic.Int64
			cfg := &pglimitclean.Config{Schema: f.schema, Tables: []string{tc.table}, Interval: 20 * time.Millisecond, Retention: time.Minute, BatchSize: batch}
			pglimitclean.SetHooks(cfg, pglimitclean.Hooks{BatchEnd: func(_ string, rows int64, _ error) {
				batches.Add(1)
				for m := most.Load(); rows > m && !most.CompareAndSwap(m, rows); m = most.Load() {
				}
				f.w.poke()
			}})
			c, err := pglimitclean.New(testdb.Pool(t), cfg)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Start(t.Context()); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if err := c.Stop(ctx); err != nil {
					t.Error(err)
				}
			})
			f.w.until(t, "every ended row deleted", func() bool { return f.count(t, tc.table, "expires_at < now()") == 0 })
			if n := f.count(t, tc.table, "true"); n != 300 {
				t.Errorf("%d rows left, want the 300 live ones", n)
			}
			if m := most.Load(); m > batch {
				t.Errorf("a batch deleted %d rows, more than BatchSize %d", m, batch)
			}
			t.Logf("%d batches", batches.Load())
		})
	}
}

// An admission on an unlogged table is a HOT update: it adds no index
// entry.
func TestUnloggedAdmissionIsHOT(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, schema := testdb.Pool(t), testdb.Schema(t)
	for _, s := range []pglimit.Strategy{pglimit.Upsert, pglimit.NoWait} {
		table := "pglimit_" + string(s) + "_unlogged"
		lim, err := pglimit.New(pool, &pglimit.Config{Strategy: s, Schema: schema, Table: table,
			Limits: []pglimit.Limit{{Rate: 1, Period: time.Hour, Burst: 2}}})
		if err != nil {
			t.Fatal(err)
		}
		if d, err := lim.Allow(ctx, "k"); err != nil || !d.Allowed { // inserts the row
			t.Fatalf("%s: %+v, %v", s, d, err)
		}
		err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if d, err := lim.AllowTx(ctx, tx, "k"); err != nil || !d.Allowed { // updates it
				t.Fatalf("%s: %+v, %v", s, d, err)
			}
			var updated, hot int64
			q := `SELECT pg_stat_get_xact_tuples_updated(c), pg_stat_get_xact_tuples_hot_updated(c) FROM to_regclass($1) AS c`
			if err := tx.QueryRow(ctx, q, pgx.Identifier{schema, table}.Sanitize()).Scan(&updated, &hot); err != nil {
				return err
			}
			if updated != 1 || hot != 1 {
				t.Errorf("%s: %d updates, %d of them HOT; want 1 HOT update", table, updated, hot)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}
