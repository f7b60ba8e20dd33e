// Command demo is a small HTTP service that shows pglimit in a real
// application: POST /items creates an item for a user and is limited per
// user by two limits at once (a rate with a burst, and a daily quota),
// GET /items/{user} lists them and is limited to one call per cooldown per
// user, and GET /exports/{user}, a slow CSV export, runs at most twice at
// once per user (a concurrency limit) and waits for one of a fleet-wide
// number of export slots, shared fairly among organisations (the org
// query parameter, or else the user); every limit is shared by every
// instance through PostgreSQL.
//
// With no database URL it starts a throwaway PostgreSQL from local binaries
// (or Docker) and deletes it on exit, so `go run ./demo` needs no setup.
//
// Flags and their environment variables (the flag wins):
//
//	-addr               PGLIMIT_DEMO_ADDR          listen address (127.0.0.1:8080; :8080 for every interface)
//	-database-url       DATABASE_URL               PostgreSQL URL ("" starts a throwaway server)
//	-strategy           PGLIMIT_STRATEGY           upsert, nowait or range (upsert)
//	-cooldown           PGLIMIT_COOLDOWN           per-user cooldown of GET /items/{user} (2s)
//	-items-per-minute   PGLIMIT_ITEMS_PER_MINUTE   POST /items per user per minute, GCRA (5)
//	-items-burst        PGLIMIT_ITEMS_BURST        of which at once (3)
//	-items-per-day      PGLIMIT_ITEMS_PER_DAY      POST /items per user per day, a fixed window (20)
//	-exports-at-once    PGLIMIT_EXPORTS_AT_ONCE    GET /exports/{user} running at once per user (2)
//	-export-time        PGLIMIT_EXPORT_TIME        how long an export works (3s)
//	-export-slots       PGLIMIT_EXPORT_SLOTS       exports running at once in the fleet, shared fairly per organisation (8)
//	-migrate            PGLIMIT_MIGRATE            apply pglimit's and the demo's schema at start (true)
//	-schema             PGLIMIT_SCHEMA             schema of every table (public)
//	-on-error           PGLIMIT_ON_ERROR           unavailable, fail-open or fail-closed (unavailable)
//	-instance           PGLIMIT_DEMO_INSTANCE      this instance's name in logs and metrics (host name)
//	-metrics-max-users  PGLIMIT_DEMO_MAX_USERS     users with their own metric label; 0 disables (100)
//	-cleanup            PGLIMIT_CLEANUP            run the cleanup job, led by one instance (true)
//	-cleanup-interval   PGLIMIT_CLEANUP_INTERVAL   time between cleanup runs (30s)
//	-cleanup-retention  PGLIMIT_CLEANUP_RETENTION  delete rows whose cooldown ended longer ago than this (1m)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pglimit/cooldown/internal/pgserver"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimitclean"
	"github.com/pglimit/cooldown/pglimit/pglimithttp"
	"github.com/pglimit/cooldown/pglimit/pglimitprom"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stderr, nil); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// config is the demo's configuration after flags and environment.
type config struct {
	addr         string
	databaseURL  string
	databaseFrom string // "-database-url" or "DATABASE_URL"; "" for a throwaway server
	strategy     pglimit.Strategy
	cooldown     time.Duration
	migrate      bool

	itemsPerMinute, itemsBurst, itemsPerDay int

	exportsAtOnce int
	exportTime    time.Duration
	// exportSlots is how many exports run at once in the whole fleet,
	// shared by fair share among the organisations that wait.
	exportSlots int

	// searchOrgPerMinute and searchUserPerMinute limit GET /search, by
	// the items it finds, per organisation and per user of one.
	searchOrgPerMinute, searchUserPerMinute int

	// reportsPerMonth is an organisation's plan: reports a month from the
	// day it signed up, and reportsHardCap the most with overage.
	reportsPerMonth, reportsHardCap int

	schema   string
	onError  pglimithttp.ErrorPolicy
	instance string
	maxUsers int

	cleanup          bool
	cleanupInterval  time.Duration
	cleanupRetention time.Duration
}

// parseConfig reads args, with defaults taken from the environment.
func parseConfig(args []string, getenv func(string) string, output io.Writer) (config, error) {
	var envErrs []error
	env := func(name, def string) string {
		if v := getenv(name); v != "" {
			return v
		}
		return def
	}
	// envAs parses a typed default from the environment; a bad value is
	// reported under the variable's name rather than silently ignored.
	envAs := func(name string, parse func(string) error) {
		if v := getenv(name); v != "" {
			if err := parse(v); err != nil {
				envErrs = append(envErrs, fmt.Errorf("%s=%q: %w", name, v, err))
			}
		}
	}
	c := config{
		cooldown: 2 * time.Second, migrate: true, maxUsers: 100,
		itemsPerMinute: 5, itemsBurst: 3, itemsPerDay: 20,
		exportsAtOnce: 2, exportTime: 3 * time.Second, exportSlots: 8,
		searchOrgPerMinute: 600, searchUserPerMinute: 100,
		reportsPerMonth: 100, reportsHardCap: 120,
		// Shorter than the library's defaults, so that the dashboard's
		// cleanup panels move within minutes of trying the demo.
		cleanup: true, cleanupInterval: 30 * time.Second, cleanupRetention: time.Minute,
	}
	envAs("PGLIMIT_COOLDOWN", func(v string) (err error) { c.cooldown, err = time.ParseDuration(v); return err })
	envAs("PGLIMIT_ITEMS_PER_MINUTE", func(v string) (err error) { c.itemsPerMinute, err = strconv.Atoi(v); return err })
	envAs("PGLIMIT_ITEMS_BURST", func(v string) (err error) { c.itemsBurst, err = strconv.Atoi(v); return err })
	envAs("PGLIMIT_ITEMS_PER_DAY", func(v string) (err error) { c.itemsPerDay, err = strconv.Atoi(v); return err })
	envAs("PGLIMIT_EXPORTS_AT_ONCE", func(v string) (err error) { c.exportsAtOnce, err = strconv.Atoi(v); return err })
	envAs("PGLIMIT_EXPORT_TIME", func(v string) (err error) { c.exportTime, err = time.ParseDuration(v); return err })
	envAs("PGLIMIT_EXPORT_SLOTS", func(v string) (err error) { c.exportSlots, err = strconv.Atoi(v); return err })
	envAs("PGLIMIT_REPORTS_PER_MONTH", func(v string) (err error) { c.reportsPerMonth, err = strconv.Atoi(v); return err })
	envAs("PGLIMIT_REPORTS_HARD_CAP", func(v string) (err error) { c.reportsHardCap, err = strconv.Atoi(v); return err })
	envAs("PGLIMIT_MIGRATE", func(v string) (err error) { c.migrate, err = strconv.ParseBool(v); return err })
	envAs("PGLIMIT_DEMO_MAX_USERS", func(v string) (err error) { c.maxUsers, err = strconv.Atoi(v); return err })
	envAs("PGLIMIT_CLEANUP", func(v string) (err error) { c.cleanup, err = strconv.ParseBool(v); return err })
	envAs("PGLIMIT_CLEANUP_INTERVAL", func(v string) (err error) { c.cleanupInterval, err = time.ParseDuration(v); return err })
	envAs("PGLIMIT_CLEANUP_RETENTION", func(v string) (err error) { c.cleanupRetention, err = time.ParseDuration(v); return err })
	if err := errors.Join(envErrs...); err != nil {
		return config{}, err
	}
	host, _ := os.Hostname()
	var strategy, onError string

	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(output)
	// Loopback by default: the demo has no authentication, and a
	// container or a second machine sets the address it needs.
	fs.StringVar(&c.addr, "addr", env("PGLIMIT_DEMO_ADDR", "127.0.0.1:8080"), "listen address; :8080 for every interface (env PGLIMIT_DEMO_ADDR)")
	fs.StringVar(&c.databaseURL, "database-url", env("DATABASE_URL", ""), `PostgreSQL URL; empty starts a throwaway server (env DATABASE_URL)`)
	fs.StringVar(&strategy, "strategy", env("PGLIMIT_STRATEGY", "upsert"), "limiter strategy: upsert, nowait or range (env PGLIMIT_STRATEGY)")
	fs.DurationVar(&c.cooldown, "cooldown", c.cooldown, "per-user cooldown of GET /items/{user} (env PGLIMIT_COOLDOWN)")
	fs.IntVar(&c.itemsPerMinute, "items-per-minute", c.itemsPerMinute, "POST /items per user per minute, GCRA (env PGLIMIT_ITEMS_PER_MINUTE)")
	fs.IntVar(&c.itemsBurst, "items-burst", c.itemsBurst, "POST /items per user at once, within the per-minute rate (env PGLIMIT_ITEMS_BURST)")
	fs.IntVar(&c.itemsPerDay, "items-per-day", c.itemsPerDay, "POST /items per user per day, a fixed window (env PGLIMIT_ITEMS_PER_DAY)")
	fs.IntVar(&c.exportsAtOnce, "exports-at-once", c.exportsAtOnce, "GET /exports/{user} running at once per user (env PGLIMIT_EXPORTS_AT_ONCE)")
	fs.DurationVar(&c.exportTime, "export-time", c.exportTime, "how long an export works (env PGLIMIT_EXPORT_TIME)")
	fs.IntVar(&c.exportSlots, "export-slots", c.exportSlots, "exports running at once in the fleet, shared fairly per organisation (env PGLIMIT_EXPORT_SLOTS)")
	fs.IntVar(&c.reportsPerMonth, "reports-per-month", c.reportsPerMonth, "POST /orgs/{org}/reports a month per organisation, from the day it signed up (env PGLIMIT_REPORTS_PER_MONTH)")
	fs.IntVar(&c.reportsHardCap, "reports-hard-cap", c.reportsHardCap, "reports a month with overage, at least -reports-per-month (env PGLIMIT_REPORTS_HARD_CAP)")
	fs.BoolVar(&c.migrate, "migrate", c.migrate, "apply pglimit's and the demo's schema at start (env PGLIMIT_MIGRATE)")
	fs.StringVar(&c.schema, "schema", env("PGLIMIT_SCHEMA", "public"), "schema of every table (env PGLIMIT_SCHEMA)")
	fs.StringVar(&onError, "on-error", env("PGLIMIT_ON_ERROR", "unavailable"), "when the database fails: unavailable (503), fail-open or fail-closed (429) (env PGLIMIT_ON_ERROR)")
	fs.StringVar(&c.instance, "instance", env("PGLIMIT_DEMO_INSTANCE", host), "instance name for logs and metrics (env PGLIMIT_DEMO_INSTANCE)")
	fs.IntVar(&c.maxUsers, "metrics-max-users", c.maxUsers, `users with their own metric label, the rest count as "other"; 0 disables (env PGLIMIT_DEMO_MAX_USERS)`)
	fs.BoolVar(&c.cleanup, "cleanup", c.cleanup, "run the cleanup job; the instances elect one leader to run it (env PGLIMIT_CLEANUP)")
	fs.DurationVar(&c.cleanupInterval, "cleanup-interval", c.cleanupInterval, "time between cleanup runs (env PGLIMIT_CLEANUP_INTERVAL)")
	fs.DurationVar(&c.cleanupRetention, "cleanup-retention", c.cleanupRetention, "delete limiter rows whose cooldown ended longer ago than this (env PGLIMIT_CLEANUP_RETENTION)")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if c.databaseURL != "" {
		c.databaseFrom = "DATABASE_URL"
		fs.Visit(func(f *flag.Flag) {
			if f.Name == "database-url" {
				c.databaseFrom = "-database-url"
			}
		})
	}

	var err error
	if c.strategy, err = pglimit.ParseStrategy(strategy); err != nil {
		return config{}, fmt.Errorf("-strategy: %w", err)
	}
	if c.cooldown <= 0 {
		return config{}, fmt.Errorf("-cooldown: must be positive, got %s", c.cooldown)
	}
	// The library validates the limits; its errors name Limits[i], the
	// flags are named here.
	switch {
	case c.itemsPerMinute <= 0:
		return config{}, fmt.Errorf("-items-per-minute: must be positive, got %d", c.itemsPerMinute)
	case c.itemsBurst <= 0:
		return config{}, fmt.Errorf("-items-burst: must be positive, got %d", c.itemsBurst)
	case c.itemsPerDay <= 0:
		return config{}, fmt.Errorf("-items-per-day: must be positive, got %d", c.itemsPerDay)
	case c.exportsAtOnce <= 0:
		return config{}, fmt.Errorf("-exports-at-once: must be positive, got %d", c.exportsAtOnce)
	case c.exportSlots <= 0 || c.exportSlots > 10_000:
		return config{}, fmt.Errorf("-export-slots: must be from 1 to 10000, got %d", c.exportSlots)
	case c.exportTime < 0 || c.exportTime > time.Minute:
		return config{}, fmt.Errorf("-export-time: must be from 0 to 1m, got %s", c.exportTime)
	case c.reportsPerMonth <= 0:
		return config{}, fmt.Errorf("-reports-per-month: must be positive, got %d", c.reportsPerMonth)
	case c.reportsHardCap < c.reportsPerMonth:
		return config{}, fmt.Errorf("-reports-hard-cap: must be at least -reports-per-month (%d), got %d", c.reportsPerMonth, c.reportsHardCap)
	}
	if err := pglimit.ValidateIdentifier(c.schema); err != nil {
		return config{}, fmt.Errorf("-schema: %w", err)
	}
	if c.onError, err = pglimithttp.ParseErrorPolicy(onError); err != nil {
		return config{}, fmt.Errorf("-on-error: %w", err)
	}
	if c.maxUsers < 0 {
		return config{}, fmt.Errorf("-metrics-max-users: must not be negative, got %d", c.maxUsers)
	}
	if c.cleanupInterval <= 0 {
		return config{}, fmt.Errorf("-cleanup-interval: must be positive, got %s", c.cleanupInterval)
	}
	if c.cleanupRetention <= 0 {
		return config{}, fmt.Errorf("-cleanup-retention: must be positive (1ns deletes as soon as cooldowns end), got %s", c.cleanupRetention)
	}
	if c.instance == "" {
		c.instance = "demo"
	}
	return c, nil
}

// searchLimits are the limits of GET /search/{org}/{user}, an
// organisation's and a user's of it, each in units of items found; a
// search that finds more than its estimate may put them into debt, up to
// half of the limit.
func (c config) searchLimits() (org, user []pglimit.Limit) {
	return []pglimit.Limit{{Name: "org-items", Rate: c.searchOrgPerMinute, Period: time.Minute, Burst: c.searchOrgPerMinute, Debt: c.searchOrgPerMinute / 2}},
		[]pglimit.Limit{{Name: "user-items", Rate: c.searchUserPerMinute, Period: time.Minute, Burst: c.searchUserPerMinute, Debt: c.searchUserPerMinute / 2}}
}

// itemLimits are the limits of POST /items, per user, held all at once.
func (c config) itemLimits() []pglimit.Limit {
	return []pglimit.Limit{
		{Name: "per-minute", Rate: c.itemsPerMinute, Period: time.Minute, Burst: c.itemsBurst},
		{Name: "per-day", Rate: c.itemsPerDay, Period: 24 * time.Hour, Algorithm: pglimit.FixedWindow},
	}
}

const (
	startTimeout       = 5 * time.Minute // a first initdb, image pull or container launcher build is slow
	shutdownTimeout    = 10 * time.Second
	cleanupStopTimeout = 5 * time.Second // a running batch may finish; then it is cancelled
)

// run serves until ctx ends, then shuts down in order: stop accepting,
// finish requests in flight, stop the cleanup job (releasing leadership),
// close the pool, stop the throwaway PostgreSQL.
// onListen, when set, receives the bound address (tests listen on port 0).
func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer, onListen func(addr string)) (err error) {
	cfg, err := parseConfig(args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil)).With("instance", cfg.instance)
	defer func() {
		// Last of all, after the pool and any throwaway server: the word
		// that everything stopped cleanly.
		if err == nil {
			logger.Info("stopped")
		}
	}()

	startCtx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	if cfg.databaseURL == "" {
		logger.Info("no database URL configured (-database-url or DATABASE_URL): starting a throwaway PostgreSQL")
		srv, err := pgserver.Start(startCtx, &pgserver.Config{
			Durable: true, // honest latencies on the dashboard
			Logf: func(format string, args ...any) {
				logger.Info("postgres: " + fmt.Sprintf(format, args...))
			},
		})
		if err != nil {
			return fmt.Errorf("start a throwaway PostgreSQL: %w", err)
		}
		defer func() {
			logger.Info("stopping the throwaway PostgreSQL; its data is deleted")
			if cerr := srv.Close(); cerr != nil {
				err = errors.Join(err, fmt.Errorf("stop the throwaway PostgreSQL: %w", cerr))
			}
		}()
		cfg.databaseURL = srv.URL()
		logger.Info("throwaway PostgreSQL ready (deleted when the demo stops)", "source", srv.Source(), "url", cfg.databaseURL)
	}

	poolCfg, err := pgxpool.ParseConfig(cfg.databaseURL)
	if err != nil {
		// pgx's message quotes no part of the URL, so no password leaks.
		return fmt.Errorf("database URL: %w", err)
	}
	if cfg.databaseFrom != "" {
		// Loud, since the demo writes to it: a forgotten DATABASE_URL in a
		// shell would otherwise point it at a real database silently.
		cc := poolCfg.ConnConfig
		logger.Warn(fmt.Sprintf("using the database %s on %s, from %s (not a throwaway one): the demo's tables go in schema %q",
			cc.Database, net.JoinHostPort(cc.Host, strconv.Itoa(int(cc.Port))), cfg.databaseFrom, cfg.schema),
			"host", cc.Host, "port", cc.Port, "database", cc.Database, "user", cc.User, "migrate", cfg.migrate)
	}
	// Lets an operator find (or terminate) this instance's sessions.
	poolCfg.ConnConfig.RuntimeParams["application_name"] = "pglimit-demo/" + cfg.instance
	pool, err := pgxpool.NewWithConfig(startCtx, poolCfg)
	if err != nil {
		return fmt.Errorf("database pool: %w", err)
	}
	defer pool.Close()
	if err := pool.Ping(startCtx); err != nil {
		return fmt.Errorf("database unreachable: %w", err)
	}
	if cfg.migrate {
		if err := pglimit.Migrate(startCtx, pool, cfg.schema); err != nil {
			return err
		}
		if err := migrateDemo(startCtx, pool, cfg.schema); err != nil {
			return err
		}
		logger.Info("schema up to date", "schema", cfg.schema)
	}

	app, err := newApp(pool, cfg, logger)
	if err != nil {
		return err
	}
	if cfg.cleanup {
		// Started after the migrations, since Start checks the tables;
		// deferred after pool.Close, so stopped before the pool closes.
		stopCleanup, err := startCleanup(startCtx, pool, cfg, logger, app.reg)
		if err != nil {
			return err
		}
		defer func() {
			stopCtx, cancel := context.WithTimeout(context.Background(), cleanupStopTimeout)
			defer cancel()
			if serr := stopCleanup(stopCtx); serr != nil {
				err = errors.Join(err, serr)
			}
		}()
	}
	ln, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		return err
	}
	httpSrv := &http.Server{
		Handler:           app.handler(),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      15 * time.Second,
		IdleTimeout:       60 * time.Second,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	served := make(chan error, 1)
	go func() { served <- httpSrv.Serve(ln) }()
	addr := ln.Addr().String()
	logger.Info("listening", "addr", addr, "strategy", cfg.strategy, "cooldown", cfg.cooldown, "on_error", cfg.onError,
		"items_per_minute", cfg.itemsPerMinute, "items_burst", cfg.itemsBurst, "items_per_day", cfg.itemsPerDay)
	logger.Info("try: curl -i http://" + browsable(addr) + "/items/alice  (twice within " + cfg.cooldown.String() + " for a 429)")
	logger.Info(fmt.Sprintf(`try: curl -i -d '{"user":"alice","name":"x"}' http://%s/items  (%d times for a 429)`, browsable(addr), cfg.itemsBurst+1))
	if onListen != nil {
		onListen(addr)
	}

	select {
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	logger.Info("shutting down")
	shutdownCtx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := httpSrv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	<-served
	return nil
}

// startCleanup starts the cleanup job over cfg's schema and registers its
// metrics with reg. Every instance runs one; only the elected leader
// deletes. The returned function stops it.
func startCleanup(ctx context.Context, pool *pgxpool.Pool, cfg config, logger *slog.Logger, reg prometheus.Registerer) (stop func(context.Context) error, err error) {
	cleaner, err := pglimitclean.New(pool, &pglimitclean.Config{
		Schema:    cfg.schema,
		Interval:  cfg.cleanupInterval,
		Retention: cfg.cleanupRetention,
		Logger:    logger,
	})
	if err != nil {
		return nil, fmt.Errorf("cleanup: %w", err)
	}
	if err := reg.Register(pglimitprom.NewCleanerCollector(cleaner, cfg.schema)); err != nil {
		return nil, fmt.Errorf("cleanup metrics: %w", err)
	}
	if err := cleaner.Start(ctx); err != nil {
		return nil, fmt.Errorf("cleanup: %w", err)
	}
	logger.Info("cleanup job started", "interval", cfg.cleanupInterval, "retention", cfg.cleanupRetention)
	return func(ctx context.Context) error {
		if err := cleaner.Stop(ctx); err != nil {
			return fmt.Errorf("stop cleanup: %w", err)
		}
		logger.Info("cleanup job stopped")
		return nil
	}, nil
}

// browsable turns a listen address such as "[::]:8080" into one a browser
// or curl can use.
func browsable(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "localhost"
	}
	return net.JoinHostPort(host, port)
}
