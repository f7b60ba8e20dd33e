package pglimithttp_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimithttp"
	"github.com/pglimit/cooldown/pglimit/pglimittest"
)

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

	lim, err := pglimit.New(pool, &pglimit.Config{Namespace: "example-export", Cooldown: 2 * time.Second})
	if err != nil {
		panic(err)
	}
	limit, err := pglimithttp.Middleware(lim, &pglimithttp.Config{
		KeyFunc: pglimithttp.FromPathValue("user"),
	})
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /export/{user}", limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "report for", r.PathValue("user"))
	})))

	for range 2 {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest("GET", "/export/user-42", nil))
		fmt.Printf("%d RateLimit: %s Retry-After: %q\n", rec.Code, rec.Header().Get("RateLimit"), rec.Header().Get("Retry-After"))
	}
	_ = lim.Reset(ctx, "user-42")
	// Output:
	// 200 RateLimit: "cooldown";r=0;t=2 Retry-After: ""
	// 429 RateLimit: "cooldown";r=0;t=2 Retry-After: "2"
}
