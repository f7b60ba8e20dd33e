package pglimitquota_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimitquota"
)

// Every call returns by the quota's Timeout while another transaction
// holds the key's row, with ErrTimeout, and AllowTx leaves the caller's
// transaction usable.
func TestDeadlineLockedRow(t *testing.T) {
	schema := testdb.Schema(t)
	pool := testdb.Pool(t)
	const timeout = 200 * time.Millisecond
	q, err := pglimitquota.New(pool, &pglimitquota.Config{Schema: schema, Namespace: "n", Allowance: 10, Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	allow(t, ctx, q, "k", 1)
	testdb.Lock(t, testdb.Pool(t), schema, "pglimit_quota_keys", "k")
	// The bound: Timeout, plus a generous margin for a loaded machine to
	// hear the cancelled statement's error (the server's, for AllowTx,
	// 1 s after).
	const bound = timeout + 3*time.Second
	for _, c := range []struct {
		name string
		call func() error
	}{
		{"Allow", func() error { _, err := q.Allow(ctx, "k", 1); return err }},
		{"SetPlan", func() error {
			_, err := q.SetPlan(ctx, "k", pglimitquota.Plan{Anchor: pglimitquota.Anchor{Day: 1}, Allowance: 5}, pglimitquota.AtOnce)
			return err
		}},
		{"Grant", func() error { return q.Grant(ctx, "k", 1, time.Now().Add(time.Hour)) }},
		{"AllowTx", func() error {
			tx, err := pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback(ctx) }()
			_, err = q.AllowTx(ctx, tx, "k", 1)
			if _, xerr := tx.Exec(ctx, "SELECT 1"); xerr != nil {
				t.Errorf("AllowTx left tx unusable: %v", xerr)
			}
			return err
		}},
	} {
		start := time.Now()
		err := c.call()
		if took := time.Since(start); !errors.Is(err, pglimit.ErrTimeout) || took > bound {
			t.Errorf("%s on a locked row: %v after %s, want ErrTimeout within %s", c.name, err, took, bound)
		}
	}
	// Usage reads without a lock: it answers at once.
	if u, err := q.Usage(ctx, "k"); err != nil || u.Used != 1 {
		t.Errorf("Usage of a locked row: %+v, %v", u, err)
	}
}
