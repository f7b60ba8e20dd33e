package pglimithttp_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
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

// Several limits at once, and a cost per request: an upload of n files
// uses n units of both.
func ExampleCostFunc() {
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

	lim, err := pglimit.New(pool, &pglimit.Config{
		Namespace: "example-upload",
		Limits: []pglimit.Limit{
			{Name: "per-minute", Rate: 5, Period: time.Minute, Burst: 3},
			{Name: "per-day", Rate: 20, Period: 24 * time.Hour, Algorithm: pglimit.FixedWindow},
		},
	})
	if err != nil {
		panic(err)
	}
	limit, err := pglimithttp.Middleware(lim, &pglimithttp.Config{
		KeyFunc: pglimithttp.FromPathValue("user"),
		CostFunc: func(r *http.Request) (int, error) {
			return strconv.Atoi(r.URL.Query().Get("files"))
		},
	})
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /upload/{user}", limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "uploaded")
	})))

	for _, files := range []string{"2", "2", "many"} {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest("POST", "/upload/user-42?files="+files, nil))
		fmt.Printf("%d RateLimit: %s Retry-After: %q\n", rec.Code, rec.Header().Get("RateLimit"), rec.Header().Get("Retry-After"))
	}
	fmt.Println("RateLimit-Policy:", func() string {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest("POST", "/upload/user-43?files=1", nil))
		return rec.Header().Get("RateLimit-Policy")
	}())
	_ = lim.Reset(ctx, "user-42")
	_ = lim.Reset(ctx, "user-43")
	// Output:
	// 200 RateLimit: "per-minute";r=1;t=24 Retry-After: ""
	// 429 RateLimit: "per-minute";r=1;t=24 Retry-After: "12"
	// 400 RateLimit:  Retry-After: ""
	// RateLimit-Policy: "per-minute";q=5;w=60, "per-day";q=20;w=86400
}
