package pglimit_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
)

// A Range table that lost its exclusion constraint (its btree_gist
// extension dropped with CASCADE, say) would admit every request: the
// limiter refuses to decide on it, with an error naming the fix, and writes
// nothing.
func TestRangeRefusesTableWithoutConstraint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := testdb.Pool(t), testdb.Schema(t)
	table := pgx.Identifier{schema, "pglimit_range"}.Sanitize()
	if _, err := pool.Exec(ctx, "ALTER TABLE "+table+" DROP CONSTRAINT pglimit_range_no_overlap"); err != nil {
		t.Fatal(err)
	}
	lim, err := pglimit.New(pool, &pglimit.Config{Strategy: pglimit.Range, Schema: schema, Cooldown: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if d, err := lim.Allow(ctx, "k"); !errors.Is(err, pglimit.ErrNoExclusionConstraint) || d.Allowed {
			t.Fatalf("Allow: %+v, %v; want ErrNoExclusionConstraint", d, err)
		}
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d rows, %v; want none written", n, err)
	}
}
