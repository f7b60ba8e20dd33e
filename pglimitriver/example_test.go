package pglimitriver_test

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/riverqueue/river/rivertype"

	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimittest"
	"github.com/pglimit/cooldown/pglimitriver"
)

// Exports call a provider that allows 2 a second. Every worker of every
// instance takes its turn from one limit in the database: a job the
// limit refuses is snoozed, not failed, and runs in its turn.
func ExampleMiddleware() {
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
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		panic(err)
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		panic(err)
	}

	provider, err := pglimit.New(pool, &pglimit.Config{
		Namespace: "example-river",
		Limits:    []pglimit.Limit{{Name: "provider", Rate: 2, Period: time.Second}},
	})
	if err != nil {
		panic(err)
	}
	limit, err := pglimitriver.NewMiddleware(&pglimitriver.Config{Limiter: provider})
	if err != nil {
		panic(err)
	}
	ran := make(chan time.Time)
	workers := river.NewWorkers()
	river.AddWorker(workers, &exportWorker{work: func(context.Context, *river.Job[exportArgs]) error {
		ran <- time.Now()
		return nil
	}})
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 4}},
		Workers:           workers,
		Middleware:        []rivertype.Middleware{limit},
		FetchCooldown:     20 * time.Millisecond,
		FetchPollInterval: 20 * time.Millisecond,
		Logger:            slog.New(slog.DiscardHandler),
	})
	if err != nil {
		panic(err)
	}
	if err := client.Start(ctx); err != nil {
		panic(err)
	}
	defer client.Stop(ctx)

	for i := range 3 {
		if _, err := client.Insert(ctx, exportArgs{Customer: "acme", Seq: i}, nil); err != nil {
			panic(err)
		}
	}
	first := <-ran
	<-ran
	last := <-ran
	fmt.Println("3 exports took at least a second:", last.Sub(first) >= time.Second-10*time.Millisecond)
	// Output:
	// 3 exports took at least a second: true
}
