package pglimitsem_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimitsem"
)

// At most two exports running per user, across every instance: a third
// is refused while two run, and admitted once one is released.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL())
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if err := pglimit.Migrate(ctx, pool, ""); err != nil {
		panic(err)
	}
	exports, err := pglimitsem.New(pool, &pglimitsem.Config{
		Namespace: "example-exports",
		Slots:     2,
		TTL:       time.Minute, // a crashed export's slot returns after a minute
	})
	if err != nil {
		panic(err)
	}

	first, _ := exports.Acquire(ctx, "user-42")
	second, _ := exports.Acquire(ctx, "user-42")
	third, _ := exports.Acquire(ctx, "user-42")
	fmt.Println("running:", first.Acquired, second.Acquired, "third:", third.Acquired, "held:", third.Held)

	// The first export ends; run the work in between, extending the
	// slot with Extend if it may outlast the TTL.
	if err := exports.Release(ctx, first); err != nil {
		panic(err)
	}
	third, _ = exports.Acquire(ctx, "user-42")
	fmt.Println("third after a release:", third.Acquired)

	_ = exports.Release(ctx, second)
	_ = exports.Release(ctx, third)
	// Output:
	// running: true true third: false held: 2
	// third after a release: true
}
