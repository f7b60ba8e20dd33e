package pglimitgrpc_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"

	"github.com/pglimit/cooldown/pglimit"
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
