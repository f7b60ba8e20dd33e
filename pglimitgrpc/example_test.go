package pglimitgrpc_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimitsem"
	"github.com/pglimit/cooldown/pglimitgrpc"
)

// A server whose callers, by API key, get 100 calls a second with bursts
// of 20, and whose health checks are not limited.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@127.0.0.1:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	lim, err := pglimit.New(pool, &pglimit.Config{
		Namespace: "grpc-api", // the keys' state, kept when the limits change
		Limits:    []pglimit.Limit{{Name: "per-key", Rate: 100, Period: time.Second, Burst: 20}},
	})
	if err != nil {
		log.Fatal(err)
	}
	cfg := &pglimitgrpc.Config{
		Key:    pglimitgrpc.Metadata("x-api-key"),
		Exempt: []string{"/grpc.health.v1.Health/Check"},
	}
	unary, err := pglimitgrpc.UnaryServerInterceptor(lim, cfg)
	if err != nil {
		log.Fatal(err)
	}
	stream, err := pglimitgrpc.StreamServerInterceptor(lim, cfg)
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(unary), grpc.StreamInterceptor(stream))
	_ = srv // register services, then srv.Serve(listener)
}

// A client that waits as a refusal tells it to.
func ExampleRetryDelay() {
	call := func(ctx context.Context) error { return nil } // a gRPC call
	// callWaiting makes the call again after each refusal, once the wait
	// the refusal names has passed.
	callWaiting := func(ctx context.Context) error {
		for {
			err := call(ctx)
			wait, refused := pglimitgrpc.RetryDelay(err)
			if !refused {
				return err
			}
			time.Sleep(wait)
		}
	}
	fmt.Println(callWaiting(context.Background()))
	// Output: <nil>
}

// Daily counts per organisation and user, and a cooldown per API key,
// chained: a call the inner cooldown refuses, or that has no API key, is
// charged nothing by the counts outside.
func Example_chain() {
	pool, err := pgxpool.New(context.Background(), "postgres://app@127.0.0.1:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	newLimiter := func(cfg pglimit.Config) pglimit.Limiter {
		lim, err := pglimit.New(pool, &cfg)
		if err != nil {
			log.Fatal(err)
		}
		return lim
	}
	org := newLimiter(pglimit.Config{Namespace: "org", Limits: []pglimit.Limit{{Name: "org-day", Rate: 100000, Period: 24 * time.Hour, Burst: 100000}}})
	user := newLimiter(pglimit.Config{Namespace: "user", Limits: []pglimit.Limit{{Name: "user-day", Rate: 1000, Period: 24 * time.Hour, Burst: 1000}}})
	cooldown := newLimiter(pglimit.Config{Namespace: "api-key", Cooldown: time.Second})

	levels := []pglimitgrpc.Level{
		{Limiter: org, Key: pglimitgrpc.Metadata("x-org")},
		{Limiter: user, Key: pglimitgrpc.Metadata("x-user")},
	}
	perKey := &pglimitgrpc.Config{Key: pglimitgrpc.Metadata("x-api-key")}
	counts, err := pglimitgrpc.UnaryServerLevels(levels, nil)
	if err != nil {
		log.Fatal(err)
	}
	keyed, err := pglimitgrpc.UnaryServerInterceptor(cooldown, perKey)
	if err != nil {
		log.Fatal(err)
	}
	countStreams, err := pglimitgrpc.StreamServerLevels(levels, nil)
	if err != nil {
		log.Fatal(err)
	}
	keyedStreams, err := pglimitgrpc.StreamServerInterceptor(cooldown, perKey)
	if err != nil {
		log.Fatal(err)
	}
	// Outermost first: the counts refuse most often.
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(counts, keyed),
		grpc.ChainStreamInterceptor(countStreams, keyedStreams),
	)
	_ = srv // register services, then srv.Serve(listener)
}

// At most 8 exports running at once across every instance, shared
// fairly among the organisations that wait: a call waits up to 5 s as a
// waiter of its organisation, an enterprise one weighing 3.
func Example_concurrency() {
	pool, err := pgxpool.New(context.Background(), "postgres://app@127.0.0.1:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	sem, err := pglimitsem.New(pool, &pglimitsem.Config{Namespace: "exports", Slots: 8, TTL: time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	cfg := &pglimitgrpc.Config{
		Key: pglimitgrpc.Method, // one set of 8 slots per method
		Flow: func(ctx context.Context, _ string) (pglimitsem.Flow, error) {
			md, _ := metadata.FromIncomingContext(ctx)
			org, plan := md.Get("x-org"), md.Get("x-plan")
			if len(org) != 1 {
				return pglimitsem.Flow{}, errors.New("no x-org")
			}
			weight := 1
			if len(plan) == 1 && plan[0] == "enterprise" {
				weight = 3
			}
			return pglimitsem.Flow{Name: org[0], Weight: weight}, nil
		},
		FlowWait: 5 * time.Second,
	}
	unary, err := pglimitgrpc.UnaryServerConcurrency(sem, cfg)
	if err != nil {
		log.Fatal(err)
	}
	stream, err := pglimitgrpc.StreamServerConcurrency(sem, cfg)
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(unary), grpc.StreamInterceptor(stream))
	_ = srv // register services, then srv.Serve(listener)
}
