package pglimit_test

import (
	"context"
	"fmt"
	"time"

	"github.com/pglimit/cooldown/pglimit"
)

// Several limits on one key hold all at once: a request is admitted only if
// every limit has room, and then counts against all of them.
func ExampleLimit() {
	ctx := context.Background()
	pool := migratedPool(ctx)
	defer pool.Close()

	// Item creation: 5 per minute with bursts of 3, and 20 per day.
	lim, err := pglimit.New(pool, &pglimit.Config{
		Namespace: "example-create-item",
		Limits: []pglimit.Limit{
			{Name: "per-minute", Rate: 5, Period: time.Minute, Burst: 3},
			{Name: "per-day", Rate: 20, Period: 24 * time.Hour, Algorithm: pglimit.FixedWindow},
		},
	})
	if err != nil {
		panic(err)
	}
	for range 4 {
		d, err := lim.Allow(ctx, "user-7")
		if err != nil {
			panic(err)
		}
		if d.Allowed {
			fmt.Printf("admitted; %d left under %s\n", d.Remaining, d.Limit.Name)
		} else {
			fmt.Printf("refused by %s; retry in about %s\n", d.Limit.Name, d.RetryAfter.Round(time.Second))
		}
	}
	// Output:
	// admitted; 2 left under per-minute
	// admitted; 1 left under per-minute
	// admitted; 0 left under per-minute
	// refused by per-minute; retry in about 12s
}

// A request can cost more than one unit: an export of 3 files uses 3.
func ExampleLimiter_AllowN() {
	ctx := context.Background()
	pool := migratedPool(ctx)
	defer pool.Close()

	lim, err := pglimit.New(pool, &pglimit.Config{
		Namespace: "example-export-files",
		Limits:    []pglimit.Limit{pglimit.PerHour(10)},
	})
	if err != nil {
		panic(err)
	}
	d, err := lim.AllowN(ctx, "user-7", 3)
	if err != nil {
		panic(err)
	}
	fmt.Println(d.Allowed, d.Granted, d.Remaining)
	// Output:
	// true 3 7
}

// AllowAtMost grants what is left, as a quota would: ask for 8, get 5.
func ExampleLimiter_AllowAtMost() {
	ctx := context.Background()
	pool := migratedPool(ctx)
	defer pool.Close()

	lim, err := pglimit.New(pool, &pglimit.Config{
		Namespace: "example-sms-quota",
		Limits:    []pglimit.Limit{{Rate: 5, Period: 24 * time.Hour, Algorithm: pglimit.FixedWindow}},
	})
	if err != nil {
		panic(err)
	}
	d, err := lim.AllowAtMost(ctx, "tenant-1", 8)
	if err != nil {
		panic(err)
	}
	fmt.Println("granted:", d.Granted)
	d, err = lim.AllowAtMost(ctx, "tenant-1", 8)
	if err != nil {
		panic(err)
	}
	fmt.Println("then:", d.Allowed)
	// Output:
	// granted: 5
	// then: false
}

// Reserve queues instead of refusing: past the burst, a request gets a
// slot in the future and waits for it, up to a maximum delay.
func ExampleLimiter_Reserve() {
	ctx := context.Background()
	pool := migratedPool(ctx)
	defer pool.Close()

	// One call a minute to a partner's API, queued up to 90s ahead.
	lim, err := pglimit.New(pool, &pglimit.Config{
		Namespace: "example-outbound-api",
		Limits:    []pglimit.Limit{{Rate: 1, Period: time.Minute, Burst: 1}},
	})
	if err != nil {
		panic(err)
	}
	for range 3 {
		d, err := lim.Reserve(ctx, "partner-api", 1, 90*time.Second)
		if err != nil {
			panic(err)
		}
		if !d.Allowed {
			fmt.Println("refused: the wait would exceed 90s")
			continue
		}
		// A real caller sleeps for d.Delay, then acts.
		fmt.Println("reserved; wait about", d.Delay.Round(time.Second))
	}
	// Output:
	// reserved; wait about 0s
	// reserved; wait about 1m0s
	// refused: the wait would exceed 90s
}

// Peek tells what Allow would decide, and consumes nothing.
func ExampleLimiter_Peek() {
	ctx := context.Background()
	pool := migratedPool(ctx)
	defer pool.Close()

	lim, err := pglimit.New(pool, &pglimit.Config{Namespace: "example-peek", Cooldown: time.Minute})
	if err != nil {
		panic(err)
	}
	for range 2 {
		d, err := lim.Peek(ctx, "user-7", 1)
		if err != nil {
			panic(err)
		}
		fmt.Println("would be admitted:", d.Allowed)
	}
	// Output:
	// would be admitted: true
	// would be admitted: true
}
