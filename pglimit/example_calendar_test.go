package pglimit_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/pglimit"
)

// Two exports per calendar day in Paris: the day's quota comes back at
// Paris midnight, whatever time the first export of the day was.
func ExampleLimit_calendar() {
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
		Namespace: "example-calendar",
		Limits: []pglimit.Limit{{
			Name: "daily", Rate: 2, Algorithm: pglimit.FixedWindow,
			Calendar: "day", TimeZone: "Europe/Paris",
		}},
	})
	if err != nil {
		panic(err)
	}
	defer lim.Reset(ctx, "user-42")

	for range 3 {
		d, err := lim.Allow(ctx, "user-42")
		if err != nil {
			panic(err)
		}
		fmt.Println("admitted:", d.Allowed)
		if !d.Allowed {
			paris, _ := time.LoadLocation("Europe/Paris")
			now := time.Now().In(paris)
			midnight := time.Date(now.Year(), now.Month(), now.Day()+1, 0, 0, 0, 0, paris)
			fmt.Println("back at Paris midnight:", (midnight.Sub(now)-d.RetryAfter).Abs() < 2*time.Second)
		}
	}
	// Output:
	// admitted: true
	// admitted: true
	// admitted: false
	// back at Paris midnight: true
}
