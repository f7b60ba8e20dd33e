package pglimit_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimitclean"
	"github.com/pglimit/cooldown/pglimit/pglimithttp"
	"github.com/pglimit/cooldown/pglimit/pglimitprom"
)

// main is the program's: Example_application runs serve as main would.
// docs/program.md shows main and serve as they are here
// (TestDocGoBlocks keeps them equal).
//
//lint:ignore U1000 docs/program.md's program; no test may listen on its port.
func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ln, err := net.Listen("tcp", ":8080")
	if err != nil {
		log.Fatal(err)
	}
	if err := serve(ctx, os.Getenv("DATABASE_URL"), ln); err != nil {
		log.Fatal(err)
	}
}

// serve runs a service limited by pglimit until ctx ends.
func serve(ctx context.Context, databaseURL string, ln net.Listener) error {
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()

	// Safe to run from every instance at start-up.
	if err := pglimit.Migrate(ctx, pool, ""); err != nil {
		return err
	}

	// Decisions by outcome and their latency, the pool, the cleanup job.
	reg := prometheus.NewRegistry()
	metrics, err := pglimitprom.New(reg, nil)
	if err != nil {
		return err
	}
	reg.MustRegister(pglimitprom.NewPoolCollector(pool, "main"))

	// Every user: 5 exports a minute, at most 3 at once, and 20 a day.
	lim, err := pglimit.New(pool, &pglimit.Config{
		Namespace: "exports",
		Limits: []pglimit.Limit{
			{Name: "per-minute", Rate: 5, Period: time.Minute, Burst: 3},
			{Name: "per-day", Rate: 20, Period: 24 * time.Hour, Algorithm: pglimit.FixedWindow},
		},
		Observer: metrics, // counts and times every decision
	})
	if err != nil {
		return err
	}

	// Every instance runs a cleaner; they elect one leader, which alone
	// deletes the rows of ended limits.
	cleaner, err := pglimitclean.New(pool, nil)
	if err != nil {
		return err
	}
	if err := cleaner.Start(ctx); err != nil {
		return err
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := cleaner.Stop(stopCtx); err != nil {
			slog.Warn("stopping the cleaner", "err", err)
		}
	}()
	reg.MustRegister(pglimitprom.NewCleanerCollector(cleaner, "public"))

	// 429 with Retry-After and RateLimit headers when a limit refuses.
	limit, err := pglimithttp.Middleware(lim, &pglimithttp.Config{
		KeyFunc: pglimithttp.FromPathValue("user"),
	})
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /exports/{user}", limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "export started for", r.PathValue("user"))
	})))
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))

	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	// Finish the requests in flight; then the cleaner stops and the pool
	// closes (deferred above).
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return err
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// A whole service: migrations, a limiter with two limits, its metrics, the
// HTTP middleware, the cleanup job, and a shutdown that stops them in order.
// main calls serve with a signal context and a listener on its port; here
// the example stops it.
func Example_application() {
	ctx, stop := context.WithCancel(context.Background())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	done := make(chan error, 1)
	go func() { done <- serve(ctx, databaseURL(), ln) }()

	base := "http://" + ln.Addr().String()
	for range 4 {
		resp, err := http.Post(base+"/exports/app-user", "", nil)
		if err != nil {
			panic(err)
		}
		resp.Body.Close()
		fmt.Printf("%s Retry-After: %q\n", resp.Status, resp.Header.Get("Retry-After"))
	}
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		panic(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		panic(err)
	}
	for line := range strings.Lines(string(body)) {
		if strings.HasPrefix(line, "pglimit_decisions_total") {
			fmt.Print(line)
		}
	}

	http.DefaultClient.CloseIdleConnections()
	stop()
	fmt.Println("stopped:", <-done)
	// Output:
	// 200 OK Retry-After: ""
	// 200 OK Retry-After: ""
	// 200 OK Retry-After: ""
	// 429 Too Many Requests Retry-After: "12"
	// pglimit_decisions_total{limiter="exports",outcome="admitted",strategy="upsert"} 3
	// pglimit_decisions_total{limiter="exports",outcome="canceled",strategy="upsert"} 0
	// pglimit_decisions_total{limiter="exports",outcome="error",strategy="upsert"} 0
	// pglimit_decisions_total{limiter="exports",outcome="refused",strategy="upsert"} 1
	// pglimit_decisions_total{limiter="exports",outcome="shadowed",strategy="upsert"} 0
	// stopped: <nil>
}
