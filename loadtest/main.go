// Command loadtest compares pglimit's strategies side by side under
// concurrency against a real PostgreSQL, and writes a terminal table, a
// Markdown report, a JSON file with every figure and PNG charts.
//
//	go -C loadtest run . -short          # every scenario in 3 to 4 minutes (make bench)
//	go -C loadtest run . -scale 0.1      # the seed scenario's 10-minute load in 1 minute
//	go -C loadtest run . -target http://localhost:9091,http://localhost:9095
//
// With no -database-url (or DATABASE_URL) it starts a throwaway, durable
// PostgreSQL and stops it at the end; for the peer, redis_rate, it starts
// redis-server on a free loopback port, without persistence. It exits 1
// when a strategy other than range-naive (or the peer) over-admits (for the
// general-limit variants: exceeds a limit's bound), when the default Range
// strategy deadlocks, or when the seed or limits scenario sees errors; 2
// when it cannot run. Missing a cost target is reported, not a failure.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/internal/pgserver"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// options are the parsed flags.
type options struct {
	databaseURL    string
	citusURL       string        // the Citus run instead of the scenarios (citus.go)
	soak           time.Duration // the chaos soak instead of the scenarios (soak.go)
	targets        []string
	label          string
	cooldown       time.Duration // over HTTP: the demo's
	variants       []variant
	scenarios      []string
	scale          float64
	short          bool
	levels         []int
	busyLevels     []int
	concurrency    []int
	concurrencySet bool
	keys           int
	audit          bool
	rounds         int
	poolSize       int
	out            string
	progress       bool
	command        string // how the run was invoked, without secrets
}

func parseOptions(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("loadtest", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.databaseURL, "database-url", os.Getenv("DATABASE_URL"),
		"PostgreSQL URL (default $DATABASE_URL; empty starts a throwaway server in-process, none over HTTP)")
	target := fs.String("target", "", "comma-separated base URLs of running demo instances, one instance each (default: the library in-process)")
	fs.StringVar(&o.citusURL, "citus-url", "",
		"a Citus coordinator's URL: instead of the scenarios, run the many-keys load (-keys, -rounds, -scale, -short; 8 workers unless -concurrency) "+
			"on a schema that pglimit.Distribute distributes, every strategy beside the cluster's floors (SELECT 1, and a router SELECT by key)")
	fs.DurationVar(&o.soak, "soak", 0,
		"instead of the scenarios, the chaos soak for this long (e.g. 5m): two instances on a cooldown, general limits and a busy key, "+
			"faults injected into local clusters of its own (a primary and a synchronous standby; one failover), every admission audited")
	fs.StringVar(&o.label, "label", "http", "name of what the HTTP target runs, for the report (e.g. its strategy)")
	fs.DurationVar(&o.cooldown, "cooldown", 0, "the HTTP target's cooldown, against which admissions are checked (default 2s over HTTP; in-process each scenario sets its own)")
	strategies := fs.String("strategies", "redis_rate,upsert,nowait,range,range-naive",
		"strategies to compare, in-process; each of upsert, nowait and range also comes as <name>-async (Config.AsyncCommit) and <name>-preblock (Config.PreBlockSize); upsert-unlogged on the unlogged table, upsert-preblock-inv with the pre-block and an Invalidator; "+
			"redis_rate is the peer (github.com/go-redis/redis_rate on redis-server, which must be installed), without persistence; "+
			"redis_rate-aof-everysec and redis_rate-aof-always the same with Redis's append-only file (appendfsync everysec, always). seed-upsert is the statement the project began with (INSERT ... ON CONFLICT DO UPDATE with the cooldown's guard) through pgx: the database's own rate for one admission, a ceiling. "+
			"The limits and cost-* scenarios compare their own: upsert and nowait as a cooldown, with one GCRA limit and with three limits; "+
			"busy-key and tiers theirs: redis_rate, upsert and nowait with each of their limit sets (tiers: redis_rate-aof-always too)")
	scens := fs.String("scenarios", strings.Join(scenarioNames, ","), "scenarios to run")
	fs.Float64Var(&o.scale, "scale", 1, "multiply every duration (0.1 runs the 10-minute seed load in 1 minute)")
	fs.BoolVar(&o.short, "short", false, "every scenario, the default strategies and the peer in 3 to 4 minutes (make bench; docs/benchmarks.md)")
	levels := fs.String("levels", "1,4,16,64,256", "contention: concurrency levels")
	concurrency := fs.String("concurrency", "16", "many-keys, cost-many-keys, cost-hot-key: concurrent workers (comma-separated levels); "+
		"tiers: the same when given, else 1,8,64")
	busyLevels := fs.String("busy-levels", "8,64", "busy-key: concurrency levels")
	fs.IntVar(&o.keys, "keys", 100_000, "many-keys, cost-many-keys, tiers: distinct users")
	fs.BoolVar(&o.audit, "audit", false, "in-process: the audit trigger records every admission in every scenario, "+
		"also where it is off for throughput (many-keys, cost-*, tiers), and the admissions are checked on that record too")
	fs.IntVar(&o.rounds, "rounds", 0, "cost-many-keys, cost-hot-key: rounds of the variants taking turns (default 3, 2 with -short)")
	fs.IntVar(&o.poolSize, "pool-size", 10, "seed: connections per instance")
	fs.StringVar(&o.out, "out", "out", "directory for report.md, results.json and the charts (relative to loadtest/, where it runs)")
	fs.BoolVar(&o.progress, "progress", true, "print a progress line to stderr every second")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}

	var err error
	if o.scenarios, err = parseList(*scens, scenarioNames); err != nil {
		return nil, fmt.Errorf("-scenarios: %w", err)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	o.concurrencySet = set["concurrency"]
	if o.soak != 0 && (o.soak < 0 || o.citusURL != "" || *target != "" || set["strategies"] || set["scenarios"] || set["database-url"]) {
		return nil, errors.New("-soak runs its own load on servers of its own, for a positive duration: it takes no -target, -citus-url, -strategies, -scenarios or -database-url")
	}
	if o.citusURL != "" && (*target != "" || set["strategies"] || set["scenarios"] || set["database-url"]) {
		return nil, errors.New("-citus-url runs its own comparison: it takes no -target, -strategies, -scenarios or -database-url")
	}
	if *target != "" {
		if set["strategies"] || o.audit {
			return nil, errors.New("-strategies and -audit apply in-process only: the demo instances run one strategy, name it with -label")
		}
		if set["scenarios"] {
			for _, n := range o.scenarios {
				if slices.Contains(limitScenarios, n) {
					return nil, fmt.Errorf("-scenarios %s runs in-process only: the demo's GET /items/{user} enforces a cooldown", n)
				}
			}
		}
		o.targets = strings.Split(*target, ",")
		o.variants = []variant{{Name: o.label}}
		if o.cooldown <= 0 {
			o.cooldown = 2 * time.Second
		}
	} else {
		if set["cooldown"] || set["label"] {
			return nil, errors.New("-cooldown and -label apply only with -target: in-process, each scenario sets its own cooldown")
		}
		byName := map[string]variant{}
		var names []string
		for _, v := range allVariants() {
			byName[v.Name] = v
			names = append(names, v.Name)
		}
		chosen, err := parseList(*strategies, names)
		if err != nil {
			return nil, fmt.Errorf("-strategies: %w", err)
		}
		for _, n := range chosen {
			o.variants = append(o.variants, byName[n])
		}
	}
	if o.levels, err = parseLevels(*levels); err != nil {
		return nil, fmt.Errorf("-levels: %w", err)
	}
	if o.busyLevels, err = parseLevels(*busyLevels); err != nil {
		return nil, fmt.Errorf("-busy-levels: %w", err)
	}
	if o.concurrency, err = parseLevels(*concurrency); err != nil {
		return nil, fmt.Errorf("-concurrency: %w", err)
	}
	switch {
	case o.scale <= 0:
		return nil, errors.New("-scale must be positive")
	case o.keys < 1, o.poolSize < 1, o.rounds < 0:
		return nil, errors.New("-keys and -pool-size must be positive, -rounds not negative")
	case o.rounds == 0 && o.short:
		o.rounds = 2
	case o.rounds == 0:
		o.rounds = 3
	}

	// The command as reports show it: the flags that shape the figures.
	cmd := []string{"go -C loadtest run ."}
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "out", "progress":
			return
		case "database-url", "citus-url":
			cmd = append(cmd, "-"+f.Name+"=…") // may hold a password
			return
		}
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() && f.Value.String() == "true" {
			cmd = append(cmd, "-"+f.Name)
			return
		}
		cmd = append(cmd, "-"+f.Name+" "+f.Value.String())
	})
	o.command = strings.Join(cmd, " ")
	return o, nil
}

// parseLevels parses a comma-separated list of positive numbers.
func parseLevels(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive number", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// parseList splits a comma-separated list and checks every name is known,
// keeping the order of known.
func parseList(s string, known []string) ([]string, error) {
	var want []string
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if !slices.Contains(known, f) {
			return nil, fmt.Errorf("%q is not one of %s", f, strings.Join(known, ", "))
		}
		want = append(want, f)
	}
	if len(want) == 0 {
		return nil, errors.New("empty list")
	}
	var out []string
	for _, k := range known {
		if slices.Contains(want, k) {
			out = append(out, k)
		}
	}
	return out, nil
}

// Exit codes.
const (
	exitOK          = 0
	exitFailed      = 1
	exitError       = 2
	exitInterrupted = 130
)

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseOptions(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintln(stderr, "loadtest:", err)
		return exitError
	}
	if o.citusURL != "" {
		return runCitus(ctx, o, stdout, stderr)
	}
	if o.soak > 0 {
		return runSoak(ctx, o, stdout, stderr)
	}
	rep, err := execute(ctx, o, stderr)
	if ctx.Err() != nil {
		fmt.Fprintln(stderr, "loadtest: interrupted")
		return exitInterrupted
	}
	if err != nil {
		fmt.Fprintln(stderr, "loadtest:", err)
		return exitError
	}
	writeVerdict(stdout, rep)
	if err := writeOutputs(o.out, rep); err != nil {
		fmt.Fprintln(stderr, "loadtest:", err)
		return exitError
	}
	where, err := filepath.Abs(o.out)
	if err != nil {
		where = o.out
	}
	fmt.Fprintf(stdout, "\nEvery figure: %s (tables and charts) and %s.\n",
		filepath.Join(where, "report.md"), filepath.Join(where, "results.json"))
	if len(rep.Failures) > 0 {
		for _, f := range rep.Failures {
			fmt.Fprintln(stderr, "FAIL:", f)
		}
		return exitFailed
	}
	fmt.Fprintln(stderr, "loadtest: PASS")
	return exitOK
}

// execute sets up the database and the target, runs every scenario and
// returns the report.
func execute(ctx context.Context, o *options, stderr io.Writer) (*report, error) {
	logf := func(format string, args ...any) { fmt.Fprintf(stderr, "loadtest: "+format+"\n", args...) }
	var b [3]byte
	_, _ = rand.Read(b[:])
	runID := hex.EncodeToString(b[:])
	appName := "pglimit-loadtest-" + runID
	rep := newReport(o)
	fl := floors(o.variants, o.targets == nil)
	if !slices.ContainsFunc(o.scenarios, func(n string) bool { return !slices.Contains(limitScenarios, n) }) {
		fl = nil // the limit scenarios measure no floor
	}

	scenarios := buildScenarios(o)
	extra := scenarioVariants(scenarios) // none over HTTP
	// First, so that a machine without redis-server fails at once.
	var rds *redisServer
	if slices.Contains(fl, pingFloor) || slices.ContainsFunc(extra, func(v variant) bool { return v.Redis }) {
		var err error
		if rds, err = startRedis(ctx); err != nil {
			return nil, err
		}
		defer func() {
			if err := rds.close(); err != nil {
				logf("stopping Redis: %v", err)
			}
		}()
		logf("Redis at %s (stopped and removed at exit)", rds.addr)
	}

	dbURL := o.databaseURL
	if dbURL == "" && o.targets == nil {
		srv, err := pgserver.Start(ctx, &pgserver.Config{Durable: true, Logf: logf})
		if err != nil {
			return nil, err
		}
		defer func() {
			if err := srv.Close(); err != nil {
				logf("stopping PostgreSQL: %v", err)
			}
		}()
		logf("PostgreSQL at %s (stopped and removed at exit)", srv.URL())
		dbURL = srv.URL()
		rep.Meta.Database = "throwaway PostgreSQL (" + srv.Source() + ") started by the load test, durable settings"
	}

	r := &runner{opts: o, floors: fl, stderr: stderr, runID: runID}
	if dbURL != "" {
		db, err := openDatabase(ctx, dbURL, appName)
		if err != nil {
			return nil, err
		}
		defer db.close()
		r.db = db
		if rep.Meta.Settings, err = db.settings(ctx); err != nil {
			return nil, err
		}
		if rep.Meta.Database == "" {
			rep.Meta.Database = "PostgreSQL at the given URL"
		}
	}

	if o.targets != nil {
		r.target = &overHTTP{urls: o.targets, timeout: 30 * time.Second}
		rep.Meta.Target = fmt.Sprintf("HTTP, %d demo instance(s), running %q", len(o.targets), o.label)
		rep.Meta.Floor = "GET /healthz"
	} else {
		vs := slices.Concat(r.floors, o.variants, extra)
		if err := r.db.setup(ctx, runID, vs); err != nil {
			return nil, err
		}
		defer func() {
			// Not ctx: clean up after Ctrl-C too.
			cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := r.db.dropSchemas(cctx); err != nil {
				logf("dropping schemas: %v", err)
			}
		}()
		cfg, err := pgxpool.ParseConfig(dbURL)
		if err != nil {
			return nil, err
		}
		cfg.ConnConfig.RuntimeParams["application_name"] = appName
		maxConns, err := r.db.maxConns(ctx)
		if err != nil {
			return nil, err
		}
		t := &inProcess{cfg: cfg, maxConns: maxConns, schemas: r.db.schemas}
		r.target = t
		r.ownPools = true
		rep.Meta.Target = "in-process (the library called directly; each instance its own pgxpool pool)"
		rep.Meta.Floor = "SELECT 1"
		rep.Meta.WriteFloor = fmt.Sprintf(writeFloorSQL, "<schema>", tableOf(writeFloor))
		if rds != nil {
			t.redis = rds
			rep.Meta.Peer = rds.about()
			rep.Meta.RedisFloor = "PING"
		}
	}

	for _, sc := range scenarios {
		res, err := r.scenario(ctx, &sc)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", sc.Name, err)
		}
		rep.add(&sc, res)
	}
	rep.finish()
	return rep, nil
}
