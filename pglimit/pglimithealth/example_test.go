package pglimithealth_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimithealth"
	"github.com/pglimit/cooldown/pglimit/pglimittest"
)

// A backfill's rate follows the sessions waiting on locks: one session
// waits, so every sample is over the threshold and the rate halves, from
// the ceiling of 100 a second down to the floor of 5; the lock is
// released and the rate climbs back by 20 a sample.
func Example() {
	ctx := context.Background()
	url, err := pglimittest.ServerURL()
	if err != nil {
		panic(err)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if err := pglimit.Migrate(ctx, pool, ""); err != nil {
		panic(err)
	}

	// The limiter the backfill's workers use, on the key "backfill": its
	// own rate, the floor, applies until the throttle's first sample.
	limiter := &pglimit.Config{
		Namespace: "example-backfill", Overrides: true,
		Limits: []pglimit.Limit{{Name: "rows", Rate: 5, Period: time.Second, Burst: 1}},
	}

	// Trouble: a transaction holds a lock that another session waits for.
	holder, err := pool.Begin(ctx)
	if err != nil {
		panic(err)
	}
	if _, err := holder.Exec(ctx, "SELECT pg_advisory_xact_lock(4242)"); err != nil {
		panic(err)
	}
	waiterDone := make(chan error, 1)
	go func() {
		_, err := pool.Exec(ctx, "SELECT pg_advisory_xact_lock(4242)")
		waiterDone <- err
	}()
	for waiting := 0; waiting == 0; time.Sleep(10 * time.Millisecond) {
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'").Scan(&waiting); err != nil {
			panic(err)
		}
	}

	samples := make(chan pglimithealth.State, 100)
	throttle, err := pglimithealth.New(pool, &pglimithealth.Config{
		Name: "example-backfill", Limiter: limiter, Key: "backfill",
		Signals: []pglimithealth.Signal{{Kind: pglimithealth.LockWaiters, Threshold: 0.5}},
		Floor:   5, Ceiling: 100, Increase: 20, Decrease: 0.5,
		Period: 50 * time.Millisecond,
		OnSample: func(s pglimithealth.State) {
			select { // OnSample must not block
			case samples <- s:
			default:
			}
		},
	})
	if err != nil {
		panic(err)
	}
	if err := throttle.Start(); err != nil {
		panic(err)
	}
	defer throttle.Stop(ctx) //nolint:errcheck // the example's end

	show := func(s pglimithealth.State) {
		cmp := "<="
		if s.Over {
			cmp = ">"
		}
		fmt.Printf("rate %d: %s %g %s %g\n", s.Rate, s.Signal, s.Value, cmp, s.Threshold)
	}
	for range 6 {
		show(<-samples)
	}
	if err := holder.Rollback(ctx); err != nil { // the trouble ends
		panic(err)
	}
	if err := <-waiterDone; err != nil {
		panic(err)
	}
	healthy := 0
	for healthy < 3 {
		if s := <-samples; !s.Over {
			show(s)
			healthy++
		}
	}
	// Output:
	// rate 50: lock_waiters 1 > 0.5
	// rate 25: lock_waiters 1 > 0.5
	// rate 12: lock_waiters 1 > 0.5
	// rate 6: lock_waiters 1 > 0.5
	// rate 5: lock_waiters 1 > 0.5
	// rate 5: lock_waiters 1 > 0.5
	// rate 25: lock_waiters 0 <= 0.5
	// rate 45: lock_waiters 0 <= 0.5
	// rate 65: lock_waiters 0 <= 0.5
}
