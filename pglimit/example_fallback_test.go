package pglimit_test

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/pglimit"
)

// While the database cannot be reached, each instance enforces its share
// of the limit in process instead of failing every call. Here no server
// listens at all: every decision is the fallback's.
func ExampleFallback() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@127.0.0.1:1/app?connect_timeout=1")
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	lim, err := pglimit.New(pool, &pglimit.Config{
		Namespace: "api",
		// 100 a minute for each key, shared by four instances...
		Limits: []pglimit.Limit{{Name: "per-key", Rate: 100, Period: time.Minute, Burst: 20}},
		Fallback: &pglimit.Fallback{
			// ...so a quarter of it for each while the database is away.
			Limits: []pglimit.Limit{{Name: "per-key-local", Rate: 25, Period: time.Minute, Burst: 5}},
			Logger: slog.New(slog.DiscardHandler),
		},
	})
	if err != nil {
		panic(err)
	}
	for range 6 {
		d, err := lim.Allow(ctx, "user-42")
		fmt.Println(d.Allowed, d.Fallback, err)
	}
	// Output:
	// true true <nil>
	// true true <nil>
	// true true <nil>
	// true true <nil>
	// true true <nil>
	// false true <nil>
}
