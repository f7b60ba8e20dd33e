package pglimit_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
)

// Two instances in shadow mode race on one key: every call is let through,
// exactly the burst is admitted for real, and the rest are shadow
// admissions that name the refusal and consume nothing, so an enforcing
// limiter then finds the key exactly as the burst left it.
func TestShadowUnderContention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := testdb.Schema(t)
	limit := pglimit.Limit{Name: "hourly", Rate: 5, Period: time.Hour, Burst: 5}
	for _, s := range pglimit.Strategies() {
		if s == pglimit.Range {
			continue // a cooldown only; TestShadowInTx covers it
		}
		t.Run(string(s), func(t *testing.T) {
			t.Parallel()
			cfg := pglimit.Config{Schema: schema, Namespace: string(s), Strategy: s, Limits: []pglimit.Limit{limit}, Shadow: true}
			lims := []pglimit.Limiter{newLimiterOn(t, testdb.Pool(t), cfg), newLimiterOn(t, testdb.Pool(t), cfg)}
			const calls = 40
			ds := make([]pglimit.Decision, calls)
			var wg sync.WaitGroup
			for i := range calls {
				wg.Go(func() {
					d, err := lims[i%2].Allow(ctx, "k")
					if err != nil {
						t.Error(err)
					}
					ds[i] = d
				})
			}
			wg.Wait()
			real := 0
			for _, d := range ds {
				switch {
				case !d.Allowed || d.Granted != 1:
					t.Fatalf("a shadow limiter's decision: %+v, want let through", d)
				case !d.Shadow:
					real++
				case d.RetryAfter <= 0 || len(d.Violated()) != 1 || d.Violated()[0].Name != "hourly":
					t.Fatalf("a shadow admission: %+v, violated %v; want the refusal's wait and limit", d, d.Violated())
				}
			}
			if real != 5 {
				t.Fatalf("%d calls in shadow mode: %d admitted for real, want the burst, 5", calls, real)
			}
			cfg.Shadow = false
			d, err := newLimiterOn(t, testdb.Pool(t), cfg).Allow(ctx, "k")
			if err != nil || d.Allowed || d.RetryAfter > 12*time.Minute {
				t.Fatalf("enforcing after the shadow run: %+v, %v; want refused for at most one emission interval, 12m", d, err)
			}
		})
	}
}

// In a caller's transaction, and with AllowAtMost, shadow mode lets a
// refusal through with the units asked for, and the key's state is not
// moved: the cooldown's wait is the one the real admission started.
func TestShadowInTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	schema := testdb.Schema(t)
	for _, s := range pglimit.Strategies() {
		t.Run(string(s), func(t *testing.T) {
			t.Parallel()
			cfg := pglimit.Config{Schema: schema, Namespace: string(s), Strategy: s, Cooldown: time.Hour, Shadow: true}
			lim := newLimiterOn(t, pool, cfg)
			first, err := lim.Allow(ctx, "k")
			if err != nil || !first.Allowed || first.Shadow {
				t.Fatalf("first call: %+v, %v; want a real admission", first, err)
			}
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			d, err := lim.AllowTx(ctx, tx, "k")
			if err != nil || !d.Allowed || !d.Shadow || d.RetryAfter <= 0 {
				t.Fatalf("AllowTx in cooldown: %+v, %v; want a shadow admission", d, err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if s != pglimit.Range {
				if d, err := lim.AllowAtMost(ctx, "k", 3); err != nil || !d.Shadow || d.Granted != 3 {
					t.Fatalf("AllowAtMost in cooldown: %+v, %v; want a shadow admission of 3", d, err)
				}
			}
			cfg.Shadow = false
			d, err = newLimiterOn(t, pool, cfg).Peek(ctx, "k", 1)
			if err != nil || d.Allowed || d.RetryAfter > time.Hour || d.RetryAfter < time.Hour-time.Minute {
				t.Fatalf("enforcing Peek: %+v, %v; want the first admission's hour, no more", d, err)
			}
		})
	}
}

// newLimiterOn builds a limiter of cfg on db.
func newLimiterOn(t testing.TB, db pglimit.DB, cfg pglimit.Config) pglimit.Limiter {
	t.Helper()
	return testdb.Limiter(t, db, &cfg)
}
