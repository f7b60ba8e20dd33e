package pglimit_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/pglimit"
)

// Background jobs that call a provider allowing 10 calls a second wait
// their turn instead of failing: three jobs run 100 ms apart, whichever
// instance they run on.
func ExampleWait() {
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
		Namespace: "example-wait",
		Limits:    []pglimit.Limit{{Name: "provider", Rate: 10, Period: time.Second, Burst: 1}},
	})
	if err != nil {
		panic(err)
	}
	defer lim.Reset(ctx, "payments-api")

	start := time.Now()
	for job := range 3 {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if _, err := pglimit.Wait(ctx, lim, "payments-api"); err != nil {
			panic(err)
		}
		cancel()
		turn := time.Duration(job) * 100 * time.Millisecond
		fmt.Printf("job %d runs, no sooner than %s after the first: %t\n", job+1, turn, time.Since(start) >= turn)
	}
	// Output:
	// job 1 runs, no sooner than 0s after the first: true
	// job 2 runs, no sooner than 100ms after the first: true
	// job 3 runs, no sooner than 200ms after the first: true
}
