package pglimit_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
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

// A Table or Schema that names no table, or a table of another strategy's
// shape, passes New (which reads nothing), and the first decision that
// uses it says so: ErrInvalidConfig naming the table, from every call and
// from concurrent ones, never a bare SQLSTATE that looks like an outage.
func TestMisspeltTableIsInvalidConfig(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := testdb.Pool(t), testdb.Schema(t)
	perMinute := []pglimit.Limit{pglimit.PerMinute(5)}
	general := []pglimit.Limit{pglimit.PerMinute(5), {Name: "daily", Rate: 100, Period: 24 * time.Hour, Algorithm: pglimit.FixedWindow}}
	for _, tc := range []struct {
		name  string
		cfg   pglimit.Config
		names string // what the error must name
	}{
		{"misspelt table", pglimit.Config{Schema: schema, Table: "pglimit_upsrt", Limits: perMinute}, "pglimit_upsrt"},
		{"misspelt schema", pglimit.Config{Schema: schema + "x", Limits: perMinute}, schema + "x"},
		{"Range on an Upsert table", pglimit.Config{Strategy: pglimit.Range, Schema: schema, Table: "pglimit_upsert", Cooldown: time.Minute}, "pglimit_upsert"},
		{"Upsert on a Range table", pglimit.Config{Schema: schema, Table: "pglimit_range", Limits: perMinute}, "pglimit_range"},
		{"NoWait's limits on a Range table", pglimit.Config{Strategy: pglimit.NoWait, Schema: schema, Table: "pglimit_range", Limits: general}, "pglimit_range"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lim, err := pglimit.New(pool, &tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			want := func(what string, err error) {
				t.Helper()
				if !errors.Is(err, pglimit.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.names) {
					t.Errorf("%s: %v; want ErrInvalidConfig naming %s", what, err, tc.names)
				}
			}
			errs := make([]error, 8)
			var wg sync.WaitGroup
			for i := range errs {
				wg.Go(func() { _, errs[i] = lim.Allow(ctx, "k") })
			}
			wg.Wait()
			for i, err := range errs {
				want(fmt.Sprintf("concurrent Allow %d", i+1), err)
			}
			_, err = lim.Allow(ctx, "k")
			want("Allow", err)
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(ctx) }()
			_, err = lim.AllowTx(ctx, tx, "k")
			want("AllowTx", err)
			if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
				t.Errorf("the caller's transaction after AllowTx: %v; want it usable", err)
			}
			want("Reset", lim.Reset(ctx, "k"))
		})
	}
}
