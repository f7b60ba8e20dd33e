package pglimithttp_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimithttp"
	"github.com/pglimit/cooldown/pglimit/pglimittest"
)

// exampleLimiter is a cooldown limiter on the test server, which stands for
// the application's database; the key is reset when the example ends.
func exampleLimiter(namespace string, cooldown time.Duration) (lim pglimit.Limiter, done func()) {
	return exampleLimiterOf(pglimit.Config{Namespace: namespace, Cooldown: cooldown})
}

// exampleLimiterOf is exampleLimiter of any configuration.
func exampleLimiterOf(cfg pglimit.Config) (lim pglimit.Limiter, done func()) {
	ctx := context.Background()
	url, err := pglimittest.ServerURL()
	if err != nil {
		panic(err)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		panic(err)
	}
	if err := pglimit.Migrate(ctx, pool, ""); err != nil {
		panic(err)
	}
	lim, err = pglimit.New(pool, &cfg)
	if err != nil {
		panic(err)
	}
	return lim, func() {
		_ = lim.Reset(ctx, "user-42")
		pool.Close()
	}
}

func serve(h http.Handler, req *http.Request) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// Health checks and callers an earlier middleware vouches for skip the
// limit with Exempt; a few known keys, with ExemptKeys.
func ExampleConfig_exempt() {
	lim, done := exampleLimiter("example-exempt", time.Minute)
	defer done()
	limit, err := pglimithttp.Middleware(lim, &pglimithttp.Config{
		KeyFunc:    pglimithttp.FromPathValue("user"),
		Exempt:     func(r *http.Request) bool { return r.Header.Get("X-Internal-Token") == "s3cret" },
		ExemptKeys: []string{"monitoring"},
	})
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /export/{user}", limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})))

	internal := httptest.NewRequest("GET", "/export/user-42", nil)
	internal.Header.Set("X-Internal-Token", "s3cret")
	for range 2 {
		fmt.Println("internal:", serve(mux, internal).Code)
		fmt.Println("monitoring:", serve(mux, httptest.NewRequest("GET", "/export/monitoring", nil)).Code)
		fmt.Println("user-42:", serve(mux, httptest.NewRequest("GET", "/export/user-42", nil)).Code)
	}
	// Output:
	// internal: 200
	// monitoring: 200
	// user-42: 200
	// internal: 200
	// monitoring: 200
	// user-42: 429
}

// A refusal in the application's own format. The middleware has set
// Retry-After and the RateLimit headers; the handler writes the rest.
func ExampleConfig_onRefused() {
	lim, done := exampleLimiter("example-refused", time.Minute)
	defer done()
	limit, err := pglimithttp.Middleware(lim, &pglimithttp.Config{
		KeyFunc: pglimithttp.FromPathValue("user"),
		OnRefused: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			w.WriteHeader(http.StatusTooManyRequests)
			fmt.Fprintf(w, "<p>One export per minute. Try again in %s seconds.</p>\n", w.Header().Get("Retry-After"))
		}),
	})
	if err != nil {
		panic(err)
	}
	h := limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	mux := http.NewServeMux()
	mux.Handle("GET /export/{user}", h)

	serve(mux, httptest.NewRequest("GET", "/export/user-42", nil))
	rec := serve(mux, httptest.NewRequest("GET", "/export/user-42", nil))
	fmt.Print(rec.Code, " ", rec.Body)
	// Output:
	// 429 <p>One export per minute. Try again in 60 seconds.</p>
}

// A new limit rolled out in shadow mode: every request reaches the
// handler, and OnDecision sees which ones enforcing it would refuse.
func ExampleConfig_shadow() {
	lim, done := exampleLimiterOf(pglimit.Config{Namespace: "example-shadow", Cooldown: time.Minute, Shadow: true})
	defer done()
	limit, err := pglimithttp.Middleware(lim, &pglimithttp.Config{
		KeyFunc: pglimithttp.FromPathValue("user"),
		OnDecision: func(r *http.Request, ev pglimithttp.Event) {
			fmt.Println(ev.Outcome, "would wait", ev.Decision.RetryAfter.Round(time.Minute))
		},
	})
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /export/{user}", limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})))

	for range 2 {
		rec := serve(mux, httptest.NewRequest("GET", "/export/user-42", nil))
		fmt.Println(rec.Code)
	}
	// Output:
	// admitted would wait 0s
	// 200
	// shadowed would wait 1m0s
	// 200
}

// Failures are logged to slog.Default unless a Logger is given, at most
// one line per LogInterval: here the first of three.
func ExampleConfig_logger() {
	// A database that refuses connections.
	pool, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:1/postgres?sslmode=disable")
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	lim, err := pglimit.New(pool, &pglimit.Config{Namespace: "export", Cooldown: time.Minute, Timeout: time.Second})
	if err != nil {
		panic(err)
	}
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey || a.Key == "err" { // the error names a host and port
				return slog.Attr{}
			}
			return a
		},
	}))
	limit, err := pglimithttp.Middleware(lim, &pglimithttp.Config{
		KeyFunc:     pglimithttp.FromPathValue("user"),
		Logger:      logger,
		LogInterval: time.Minute,
	})
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /export/{user}", limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})))
	for range 3 {
		fmt.Println(serve(mux, httptest.NewRequest("GET", "/export/user-42", nil)).Code)
	}
	// Output:
	// level=WARN msg="pglimithttp: limiter failed" key=user-42 on_error=unavailable suppressed=0
	// 503
	// 503
	// 503
}

// The handler reads the decision that let the request through.
func ExampleDecisionFrom() {
	lim, done := exampleLimiter("example-decision", time.Minute)
	defer done()
	limit, err := pglimithttp.Middleware(lim, &pglimithttp.Config{KeyFunc: pglimithttp.FromPathValue("user")})
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /export/{user}", limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if d, ok := pglimithttp.DecisionFrom(r.Context()); ok {
			fmt.Printf("admitted under %q, %d left, full again in about %s\n", d.Limit.Name, d.Remaining, d.ResetAfter.Round(time.Minute))
		}
	})))
	serve(mux, httptest.NewRequest("GET", "/export/user-42", nil))
	// Output:
	// admitted under "cooldown", 0 left, full again in about 1m0s
}

// Behind a reverse proxy on 10.0.0.0/8 that writes the standard Forwarded
// header: the key is the client the proxy saw, an IPv6 client by its /64.
// What the client wrote itself, on the left, is never read.
func ExampleRemoteIP() {
	keyOf, err := pglimithttp.RemoteIP(&pglimithttp.RemoteIPConfig{
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
		Header:         "Forwarded",
	})
	if err != nil {
		panic(err)
	}
	for _, tt := range []struct{ peer, forwarded string }{
		{"10.0.0.7:39000", `for=192.0.2.60;proto=https`},
		{"10.0.0.7:39000", `for=198.51.100.1, for="[2001:db8:cafe:17::1]:4711"`},
		{"10.0.0.7:39000", `for=198.51.100.1, for=_hidden`},
		{"203.0.113.5:4000", `for=198.51.100.1`},
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = tt.peer
		r.Header.Set("Forwarded", tt.forwarded)
		key, err := keyOf(r)
		fmt.Println(key, err)
	}
	// Output:
	// 192.0.2.60 <nil>
	// 2001:db8:cafe:17::/64 <nil>
	// 10.0.0.7 <nil>
	// 203.0.113.5 <nil>
}
