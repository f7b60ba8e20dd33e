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

// A general-limit row is cleaned only once every limit in it is fully
// replenished: a key whose GCRA limit has recovered but whose window is
// still counting keeps its row, and with it its quota.
func TestCleanerKeepsLiveLimitState(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := testdb.Pool(t), testdb.Schema(t)
	const window = 5 * time.Second
	lim, err := pglimit.New(pool, &pglimit.Config{Schema: schema, Limits: []pglimit.Limit{
		{Name: "fast", Rate: 10, Period: 100 * time.Millisecond, Burst: 1},
		{Name: "window", Rate: 2, Period: window, Algorithm: pglimit.FixedWindow},
	}})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if d, err := lim.Allow(ctx, "k"); err != nil || !d.Allowed {
		t.Fatalf("first request: %+v, %v", d, err)
	}
	time.Sleep(50 * time.Millisecond) // "fast" is replenished: 10ms per unit

	clean := func() {
		t.Helper()
		var batches atomic.Int32
		w := newWatch()
		cfg := &pglimitclean.Config{Schema: schema, Tables: []string{"pglimit_upsert"}, Interval: 20 * time.Millisecond, Retention: time.Nanosecond}
		pglimitclean.SetHooks(cfg, pglimitclean.Hooks{BatchEnd: func(string, int64, error) { batches.Add(1); w.poke() }})
		c, err := pglimitclean.New(pool, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}
		w.until(t, "two cleanup batches", func() bool { return batches.Load() >= 2 })
		if err := c.Stop(ctx); err != nil {
			t.Fatal(err)
		}
	}
	rows := func() int {
		var n int
		q := "SELECT count(*) FROM " + pgx.Identifier{schema, "pglimit_upsert"}.Sanitize()
		if err := pool.QueryRow(ctx, q).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	clean()
	if time.Since(start) >= window {
		t.Skipf("the machine took %s to run a cleanup; the window had ended", time.Since(start))
	}
	if n := rows(); n != 1 {
		t.Fatalf("%d rows after a cleanup while the window counts, want the key's row kept", n)
	}
	if d, err := lim.Allow(ctx, "k"); err != nil || !d.Allowed {
		t.Fatalf("second request: %+v, %v", d, err)
	}
	time.Sleep(20 * time.Millisecond)
	if d, err := lim.Allow(ctx, "k"); err != nil || d.Allowed || d.Limit.Name != "window" {
		t.Fatalf("third request in the window: %+v, %v; want refused by the window", d, err)
	}

	time.Sleep(window - time.Since(start) + 50*time.Millisecond)
	clean()
	if n := rows(); n != 0 {
		t.Fatalf("%d rows after a cleanup once every limit had replenished, want 0", n)
	}
}
