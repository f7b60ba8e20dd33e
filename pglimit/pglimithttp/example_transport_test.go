package pglimithttp_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimithttp"
	"github.com/pglimit/cooldown/pglimit/pglimittest"
)

// An application calls a payment provider that allows it 20 requests a
// second. Every instance takes its turn from one budget in the database,
// and when the provider answers 429 with Retry-After, every instance
// waits it out.
func ExampleTransport() {
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
	// The provider, for the example: its second request is one too many.
	var calls atomic.Int32
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 2 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
		}
	}))
	defer provider.Close()

	budget, err := pglimit.New(pool, &pglimit.Config{
		Namespace: "example-payments",
		Limits:    []pglimit.Limit{{Name: "payments", Rate: 20, Period: time.Second, Burst: 20}},
	})
	if err != nil {
		panic(err)
	}
	transport, err := pglimithttp.NewTransport(&pglimithttp.TransportConfig{
		Limiter: budget,
		Retries: 1, // a GET answered 429 is sent once more, after the pause
	})
	if err != nil {
		panic(err)
	}
	client := &http.Client{Transport: transport}
	defer budget.Reset(ctx, provider.Listener.Addr().String())

	for range 2 {
		start := time.Now()
		resp, err := client.Get(provider.URL)
		if err != nil {
			panic(err)
		}
		resp.Body.Close()
		fmt.Println(resp.StatusCode, "after a pause:", time.Since(start) >= time.Second)
	}
	// Output:
	// 200 after a pause: false
	// 200 after a pause: true
}
