package main

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
)

// The naive Range does not pass pglimit's conformance suite: racing
// plain INSERTs on one key can deadlock (40P01), and the deadlock victim
// may be the request that would have been admitted. Without contention it
// decides like Range.
func TestNaiveRangeSequential(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	lim, err := newNaiveRange(pool, pgx.Identifier{testdb.Schema(t), "pglimit_range"}, "ns", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, false, false} {
		d, err := lim.Allow(ctx, "k")
		if err != nil || d.Allowed != want {
			t.Fatalf("request %d: %+v, %v; want Allowed=%t", i, d, err, want)
		}
		if !d.Allowed && (d.RetryAfter <= 0 || d.RetryAfter > time.Minute) {
			t.Fatalf("request %d: RetryAfter %s, want in (0, 1m]", i, d.RetryAfter)
		}
	}
	if d, err := lim.Peek(ctx, "k", 1); err != nil || d.Allowed {
		t.Errorf("Peek in cooldown: %+v, %v; want a refusal", d, err)
	}

	// A refusal in a caller's transaction leaves it usable.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		d, err := lim.AllowTx(ctx, tx, "k")
		if err != nil || d.Allowed || d.RetryAfter <= 0 {
			t.Errorf("AllowTx in cooldown: %+v, %v; want a refusal with a wait", d, err)
		}
		_, err = tx.Exec(ctx, "SELECT 1")
		return err
	})
	if err != nil {
		t.Fatalf("the transaction after a refusal: %v", err)
	}

	if err := lim.Reset(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if d, err := lim.Allow(ctx, "k"); err != nil || !d.Allowed {
		t.Errorf("Allow after Reset: %+v, %v; want admitted", d, err)
	}
	if _, err := lim.AllowN(ctx, "k", 2); !errors.Is(err, pglimit.ErrInvalidCost) {
		t.Errorf("AllowN(2) = %v, want ErrInvalidCost", err)
	}
	if _, err := lim.Allow(ctx, ""); !errors.Is(err, pglimit.ErrInvalidKey) {
		t.Errorf("Allow of an empty key = %v, want ErrInvalidKey", err)
	}
}
