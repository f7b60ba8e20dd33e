package pglimit_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/pglimit"
)

// Three exports a day count only the ones that succeed: a failed export
// gives its unit back.
func ExampleLimiter_Refund() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL())
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if err := pglimit.Migrate(ctx, pool, ""); err != nil {
		panic(err)
	}
	lim, err := pglimit.New(pool, &pglimit.Config{
		Namespace: "example-refund",
		Limits:    []pglimit.Limit{{Name: "daily", Rate: 3, Algorithm: pglimit.FixedWindow, Calendar: "day"}},
	})
	if err != nil {
		panic(err)
	}
	defer lim.Reset(ctx, "user-42")

	export := func(fail bool) string {
		d, err := lim.Allow(ctx, "user-42")
		if err != nil {
			panic(err)
		}
		if !d.Allowed {
			return "refused"
		}
		if fail { // the export failed after its decision: give the unit back
			if _, err := lim.Refund(ctx, d, 1); err != nil {
				panic(err)
			}
			return "failed, not counted"
		}
		return "done"
	}
	fmt.Println(export(false), "/", export(true), "/", export(false), "/", export(false), "/", export(false))

	d, err := lim.Allow(ctx, "user-42")
	if err != nil {
		panic(err)
	}
	_, err = lim.Refund(ctx, d, 1)
	fmt.Println("refund a refusal:", errors.Is(err, pglimit.ErrNotAdmitted))
	// Output:
	// done / failed, not counted / done / done / refused
	// refund a refusal: true
}

// A customer on a larger plan gets its own rate, without a deploy; the
// next decision on every instance uses it.
func ExampleSetKeyLimits() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL())
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if err := pglimit.Migrate(ctx, pool, ""); err != nil {
		panic(err)
	}
	cfg := &pglimit.Config{
		Namespace: "example-plans",
		Overrides: true,
		Limits:    []pglimit.Limit{{Name: "per-minute", Rate: 2, Period: time.Minute, Burst: 2}},
	}
	lim, err := pglimit.New(pool, cfg)
	if err != nil {
		panic(err)
	}
	// customer-7 is on the pro plan: 10 a minute, 5 at once.
	if err := pglimit.SetKeyLimits(ctx, lim, "customer-7", pglimit.Limit{Name: "per-minute", Rate: 10, Burst: 5}); err != nil {
		panic(err)
	}
	defer pglimit.SetKeyLimits(ctx, lim, "customer-7")
	defer lim.Reset(ctx, "customer-7")
	defer lim.Reset(ctx, "customer-8")

	for _, key := range []string{"customer-7", "customer-8"} {
		admitted := 0
		for range 10 {
			d, err := lim.Allow(ctx, key)
			if err != nil {
				panic(err)
			}
			if d.Allowed {
				admitted++
			}
		}
		fmt.Println(key, "admitted at once:", admitted)
	}
	// Output:
	// customer-7 admitted at once: 5
	// customer-8 admitted at once: 2
}
