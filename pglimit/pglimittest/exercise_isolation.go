package pglimittest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
)

// exerciseIsolation races Allow calls over pools whose sessions default to
// each isolation level (a role, database or URL setting the application
// chose): Allow runs its own statement and must decide the same way at
// every level, with contention a refusal, never a serialization error.
func (s *suite) exerciseIsolation(t *testing.T) {
	for _, level := range []string{"read committed", "repeatable read", "serializable"} {
		t.Run("DefaultIsolation/"+level, func(t *testing.T) {
			const (
				cooldown = time.Second
				keys     = 10
			)
			_, b := s.setup(t, cooldown)
			var lims []pglimit.Limiter
			for range 2 {
				pool := isolationPool(t, s.opts.serverURL(t), level)
				lims = append(lims, mustNew(t, s.newLimiter, pool, &pglimit.Config{Schema: b.schema, Cooldown: cooldown}))
			}
			ctx := context.Background()
			// First requests, then again once each key's cooldown has ended:
			// the second round races on rows every racer can see.
			for round := range 2 {
				start := time.Now()
				for i := range keys {
					key := fmt.Sprintf("k%d", i)
					n, errs := race(ctx, lims, 8, key)
					if errs != nil {
						t.Fatalf("round %d, key %s: errors: %v", round, key, errs)
					}
					// A race slower than the cooldown may rightly admit again.
					if most := 1 + int(time.Since(start)/cooldown); n < 1 || n > most {
						t.Fatalf("round %d, key %s: %d of 8 concurrent requests admitted, want 1 (at most %d)", round, key, n, most)
					}
				}
				time.Sleep(cooldown + 20*time.Millisecond)
			}
		})
	}
}

// isolationPool is a pool to the server at url whose sessions default to
// the isolation level.
func isolationPool(tb testing.TB, url, level string) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		tb.Fatal(err)
	}
	cfg.MaxConns = 4
	cfg.ConnConfig.RuntimeParams["search_path"] = ""
	cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = level
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	testdb.Warm(tb, pool)
	var got string
	if err := pool.QueryRow(context.Background(), "SHOW default_transaction_isolation").Scan(&got); err != nil || got != level {
		tb.Fatalf("pool's default isolation: %q, %v; want %q", got, err, level)
	}
	return pool
}
