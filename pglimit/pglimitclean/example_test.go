package pglimitclean_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimitclean"
	"github.com/pglimit/cooldown/pglimit/pglimittest"
)

func ExampleNew() {
	ctx := context.Background()
	url, err := pglimittest.ServerURL() // stands for the application's database
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

	// In every instance: they elect one leader, which alone deletes rows
	// whose limits ended more than Retention ago, every Interval.
	cleaner, err := pglimitclean.New(pool, &pglimitclean.Config{
		Interval:  time.Minute,
		Retention: 10 * time.Minute,
	})
	if err != nil {
		panic(err)
	}
	if err := cleaner.Start(ctx); err != nil {
		panic(err)
	}

	// At shutdown, give a running batch a few seconds to finish; Stop
	// releases leadership so that another instance takes over.
	stopCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := cleaner.Stop(stopCtx); err != nil {
		panic(err)
	}
	fmt.Println("leader after Stop:", cleaner.Stats().Leader)
	// Output:
	// leader after Stop: false
}
