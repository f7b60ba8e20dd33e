package pglimitprom_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimitclean"
	"github.com/pglimit/cooldown/pglimit/pglimitprom"
	"github.com/pglimit/cooldown/pglimit/pglimittest"
)

func ExampleMetrics() {
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

	reg := prometheus.NewRegistry() // or prometheus.DefaultRegisterer
	metrics, err := pglimitprom.New(reg, nil)
	if err != nil {
		panic(err)
	}
	reg.MustRegister(pglimitprom.NewPoolCollector(pool, "main"))

	// Labelled limiter="example-prom", strategy="upsert".
	lim, err := pglimit.New(pool, &pglimit.Config{Namespace: "example-prom", Cooldown: time.Minute, Observer: metrics})
	if err != nil {
		panic(err)
	}

	for range 3 {
		if _, err := lim.Allow(ctx, "user-7"); err != nil {
			panic(err)
		}
	}
	_ = lim.Reset(ctx, "user-7")

	n, err := testutil.GatherAndCount(reg, "pglimit_decisions_total", "pglimit_pool_max_connections")
	fmt.Println("series:", n, err)
	// Output:
	// series: 6 <nil>
}

func ExampleNewCleanerCollector() {
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

	cleaner, err := pglimitclean.New(pool, &pglimitclean.Config{Interval: time.Minute})
	if err != nil {
		panic(err)
	}
	if err := cleaner.Start(ctx); err != nil {
		panic(err)
	}
	defer cleaner.Stop(ctx)

	reg := prometheus.NewRegistry() // or prometheus.DefaultRegisterer
	reg.MustRegister(pglimitprom.NewCleanerCollector(cleaner, "public"))

	// Nothing has run yet (the first run comes one Interval after Start),
	// but every series is there from the start.
	n, err := testutil.GatherAndCount(reg)
	fmt.Println("series:", n, err)
	// Output:
	// series: 7 <nil>
}
