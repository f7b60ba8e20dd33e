package pglimit_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimittest"
)

func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL())
	if err != nil {
		panic(err)
	}
	defer pool.Close()

	// Once per deployment (safe to run from every instance at start-up).
	if err := pglimit.Migrate(ctx, pool, ""); err != nil {
		panic(err)
	}

	// One report export per user every 2 seconds, across every instance.
	lim, err := pglimit.New(pool, &pglimit.Config{
		Namespace: "export-report",
		Cooldown:  2 * time.Second,
	})
	if err != nil {
		panic(err)
	}

	d, err := lim.Allow(ctx, "user-42")
	if err != nil {
		panic(err)
	}
	fmt.Println("first call admitted:", d.Allowed)

	d, err = lim.Allow(ctx, "user-42")
	if err != nil {
		panic(err)
	}
	fmt.Println("second call admitted:", d.Allowed)
	fmt.Println("come back within 2s:", d.RetryAfter > 0 && d.RetryAfter <= 2*time.Second)

	// Support staff lift the cooldown.
	if err := lim.Reset(ctx, "user-42"); err != nil {
		panic(err)
	}
	// Output:
	// first call admitted: true
	// second call admitted: false
	// come back within 2s: true
}

// The common case, which the README opens with: one report export per
// user a minute, decided by the database for every instance at once. A
// refusal says when to come back (rounded here, as the clock runs between
// the two calls).
func ExampleLimiter_Allow() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL())
	if err != nil {
		panic(err)
	}
	defer pool.Close()

	if err := pglimit.Migrate(ctx, pool, ""); err != nil { // at start-up, from every instance
		panic(err)
	}
	lim, err := pglimit.New(pool, &pglimit.Config{Namespace: "report", Cooldown: time.Minute})
	if err != nil {
		panic(err)
	}
	for range 2 { // two requests of one user
		d, err := lim.Allow(ctx, "user-42")
		if err != nil {
			panic(err)
		}
		fmt.Println(d.Allowed, d.RetryAfter.Round(time.Minute))
	}

	if err := lim.Reset(ctx, "user-42"); err != nil {
		panic(err)
	}
	// Output:
	// true 0s
	// false 1m0s
}

// migratedPool stands for the application's pool, with the migrations
// applied.
func migratedPool(ctx context.Context) *pgxpool.Pool {
	pool, err := pgxpool.New(ctx, databaseURL())
	if err != nil {
		panic(err)
	}
	if err := pglimit.Migrate(ctx, pool, ""); err != nil {
		pool.Close()
		panic(err)
	}
	return pool
}

// databaseURL stands for the application's own database: here, the test
// server that pglimittest provides.
func databaseURL() string {
	url, err := pglimittest.ServerURL()
	if err != nil {
		panic(err)
	}
	return url
}
