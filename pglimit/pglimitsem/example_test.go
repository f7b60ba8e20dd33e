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

// A background worker waits its turn for one of a customer's two export
// slots instead of failing: three jobs start at once, the third waits for
// a slot, and gets the first one released.
func ExampleSemaphore_Wait() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL())
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if err := pglimit.Migrate(ctx, pool, ""); err != nil {
		panic(err)
	}
	exports, err := pglimitsem.New(pool, &pglimitsem.Config{Namespace: "example-wait", Slots: 2})
	if err != nil {
		panic(err)
	}

	first, _ := exports.Wait(ctx, "customer-7")
	second, _ := exports.Wait(ctx, "customer-7")
	got := make(chan pglimitsem.Slot)
	go func() {
		// Waits at most a minute for a slot.
		ctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		third, err := exports.Wait(ctx, "customer-7")
		if err != nil {
			panic(err)
		}
		got <- third
	}()
	time.Sleep(100 * time.Millisecond) // the two exports run
	fmt.Println("first and second run:", first.Acquired, second.Acquired)
	_ = exports.Release(ctx, first)
	third := <-got
	fmt.Println("third runs once the first ends:", third.Acquired)

	_ = exports.Release(ctx, second)
	_ = exports.Release(ctx, third)
	// Output:
	// first and second run: true true
	// third runs once the first ends: true
}

// Critical work keeps a share of a service's slots while batch work takes
// the rest: with 4 slots, critical keeps 1 for itself (Min 1, lending
// none), so batch gets 3, and critical still gets its one at once.
func ExampleSemaphore_AcquireLevel() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL())
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if err := pglimit.Migrate(ctx, pool, ""); err != nil {
		panic(err)
	}
	sem, err := pglimitsem.New(pool, &pglimitsem.Config{
		Namespace: "example-levels",
		Slots:     4,
		Levels: []pglimitsem.Level{
			{Name: "critical", Min: 1, Lend: 0, Max: 4},
			{Name: "batch", Min: 0, Max: 4},
		},
	})
	if err != nil {
		panic(err)
	}
	var held []pglimitsem.Slot
	batch := 0
	for range 4 {
		if slot, _ := sem.AcquireLevel(ctx, "reports", "batch"); slot.Acquired {
			held = append(held, slot)
			batch++
		}
	}
	critical, _ := sem.AcquireLevel(ctx, "reports", "critical")
	fmt.Println("batch:", batch, "critical:", critical.Acquired)
	for _, slot := range append(held, critical) {
		_ = sem.Release(ctx, slot)
	}
	// Output:
	// batch: 3 critical: true
}
