package main

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/pglimit"
)

// The Citus run (-citus-url): the many-keys load on tables that
// pglimit.Distribute distributed over a Citus cluster, each strategy beside
// the cluster's own floors measured in the same run, on the same pool: a
// SELECT 1 through the coordinator, and a router SELECT of one key's row,
// which Citus sends to the key's node (one hop, like a decision).
const (
	citusCooldown = 100 * time.Millisecond
	citusTarget   = 0.5 // every strategy at least this times the router floor
	floorSelect1  = "SELECT 1"
	floorRouter   = "router SELECT"
)

// citusVariant is one thing the Citus run measures: a floor or a limiter.
type citusVariant struct {
	name   string
	floor  bool
	config pglimit.Config
}

// citusVariants are the floors, every strategy with the cooldown, Upsert
// with AsyncCommit, and the
// general statement (three limits in one row, the GCRA one a cooldown of
// citusCooldown, so that over-admission is judged the same way).
func citusVariants() []citusVariant {
	out := []citusVariant{{name: floorSelect1, floor: true}, {name: floorRouter, floor: true}}
	for _, s := range pglimit.Strategies() {
		out = append(out, citusVariant{name: string(s), config: pglimit.Config{Strategy: s, Cooldown: citusCooldown}})
	}
	// What the worker's WAL flush costs an admission.
	out = append(out, citusVariant{name: "upsert-async", config: pglimit.Config{Cooldown: citusCooldown, AsyncCommit: true}})
	three := []pglimit.Limit{
		{Name: "rate", Rate: 1, Period: citusCooldown, Burst: 1},
		{Name: "window", Rate: 1000, Period: time.Minute, Algorithm: pglimit.FixedWindow},
		{Name: "sliding", Rate: 1000, Period: time.Minute, Algorithm: pglimit.SlidingWindow},
	}
	for _, s := range limitStrategies {
		out = append(out, citusVariant{name: string(s) + "-" + setThree, config: pglimit.Config{Strategy: s, Limits: three}})
	}
	return out
}

// citusResult is what one variant did over every round.
type citusResult struct {
	name                          string
	floor                         bool
	ops, admitted, errs, overs    int64
	elapsed                       time.Duration
	latencies                     []time.Duration
	firstErr                      error
	ratioRouter, ratioSelect1, ps float64
}

// runCitus runs the Citus comparison and prints it; it returns the exit code.
func runCitus(ctx context.Context, o *options, stdout, stderr io.Writer) int {
	logf := func(format string, args ...any) { fmt.Fprintf(stderr, "loadtest: "+format+"\n", args...) }
	workers := 8
	if o.concurrencySet {
		workers = o.concurrency[0]
	}
	window := max(time.Duration(float64(10*time.Second)*o.scale), 500*time.Millisecond)
	if o.short {
		window = max(time.Duration(float64(3*time.Second)*o.scale), 500*time.Millisecond)
	}
	res, settings, err := measureCitus(ctx, o, workers, window, logf)
	if err != nil {
		logf("citus: %v", err)
		return exitError
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Citus many-keys: %d keys drawn uniformly, %d workers on one pool to the coordinator, cooldown %s, "+
		"%d rounds of %s per variant taking turns; %s\n\n", o.keys, workers, citusCooldown, o.rounds, window, settings)
	fmt.Fprintf(&b, "| variant | decisions/s | x router floor | x SELECT 1 | admitted | errors | over-admissions | p50 | p99 |\n")
	fmt.Fprintf(&b, "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	var failures, missed []string
	for _, r := range res {
		fmt.Fprintf(&b, "| %s | %.0f | %.2f | %.2f | %s | %d | %s | %s | %s |\n", r.name, r.ps, r.ratioRouter, r.ratioSelect1,
			dash(r.floor, r.admitted), r.errs, dash(r.floor, r.overs), pct(r.latencies, 50), pct(r.latencies, 99))
		switch {
		case r.errs > 0:
			failures = append(failures, fmt.Sprintf("%s: %d errors, first: %v", r.name, r.errs, r.firstErr))
		case r.overs > 0:
			failures = append(failures, fmt.Sprintf("%s: %d over-admissions", r.name, r.overs))
		}
		if !r.floor && r.ratioRouter < citusTarget {
			missed = append(missed, fmt.Sprintf("%s x router floor %.2f", r.name, r.ratioRouter))
		}
	}
	if len(missed) > 0 {
		fmt.Fprintf(&b, "\nTarget (every strategy at least %.1fx the router floor) missed: %s.\n", citusTarget, strings.Join(missed, ", "))
	} else {
		fmt.Fprintf(&b, "\nTarget met: every strategy at least %.1fx the router floor.\n", citusTarget)
	}
	fmt.Fprintf(&b, "\nCommand: %s\n", o.command)
	fmt.Fprint(stdout, b.String())
	werr := os.MkdirAll(o.out, 0o755)
	if werr == nil {
		werr = os.WriteFile(filepath.Join(o.out, "citus.md"), []byte(b.String()), 0o644)
	}
	if werr != nil {
		logf("citus: %v", werr)
		return exitError
	}
	if len(failures) > 0 {
		for _, f := range failures {
			fmt.Fprintln(stderr, "FAIL:", f)
		}
		return exitFailed
	}
	fmt.Fprintln(stderr, "loadtest: PASS")
	return exitOK
}

func dash(floor bool, n int64) string {
	if floor {
		return "–"
	}
	return fmt.Sprint(n)
}

func pct(ls []time.Duration, p int) string {
	if len(ls) == 0 {
		return "–"
	}
	slices.Sort(ls)
	return ls[min(len(ls)*p/100, len(ls)-1)].Round(10 * time.Microsecond).String()
}

// measureCitus migrates and distributes a schema of its own, runs every
// variant in turns, and drops the schema.
func measureCitus(ctx context.Context, o *options, workers int, window time.Duration, logf func(string, ...any)) ([]*citusResult, string, error) {
	cfg, err := pgxpool.ParseConfig(o.citusURL)
	if err != nil {
		return nil, "", fmt.Errorf("-citus-url: %w", err)
	}
	cfg.MaxConns = int32(workers)
	cfg.ConnConfig.RuntimeParams["application_name"] = "pglimit-loadtest-citus"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, "", err
	}
	defer pool.Close()
	var settings string
	err = pool.QueryRow(ctx, `
SELECT format('%s, %s worker node(s), citus.max_cached_conns_per_worker %s, citus.shard_count %s',
              split_part(citus_version(), ' on ', 1), (SELECT count(*) FROM pg_dist_node WHERE groupid > 0 AND isactive),
              current_setting('citus.max_cached_conns_per_worker'), current_setting('citus.shard_count'))`).Scan(&settings)
	if err != nil {
		return nil, "", fmt.Errorf("not a Citus coordinator? %w", err)
	}
	var id [3]byte
	_, _ = crand.Read(id[:])
	schema := "pglimit_lt_citus_" + hex.EncodeToString(id[:])
	if err := pglimit.Migrate(ctx, pool, schema); err != nil {
		return nil, "", err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := pool.Exec(cctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			logf("citus: dropping schema %s: %v", schema, err)
		}
	}()
	if err := pglimit.Distribute(ctx, pool, schema); err != nil {
		return nil, "", err
	}
	logf("citus: schema %s distributed; %s", schema, settings)

	variants := citusVariants()
	results := make([]*citusResult, len(variants))
	for i, v := range variants {
		results[i] = &citusResult{name: v.name, floor: v.floor}
	}
	router := fmt.Sprintf("SELECT expires_at FROM %s WHERE namespace = $1 AND key = $2", pgx.Identifier{schema, "pglimit_upsert"}.Sanitize())
	for round := range o.rounds {
		order := slices.Clone(variants)
		idx := make([]int, len(variants))
		for i := range idx {
			idx[i] = i
		}
		if round%2 == 1 {
			slices.Reverse(order)
			slices.Reverse(idx)
		}
		for j, v := range order {
			r := results[idx[j]]
			var do func(ctx context.Context, key string) (admitted bool, err error)
			switch {
			case v.name == floorSelect1:
				do = func(ctx context.Context, _ string) (bool, error) {
					_, err := pool.Exec(ctx, "SELECT 1")
					return false, err
				}
			case v.name == floorRouter:
				do = func(ctx context.Context, key string) (bool, error) {
					_, err := pool.Exec(ctx, router, "default", key)
					return false, err
				}
			default:
				c := v.config
				c.Schema, c.Namespace = schema, v.name
				lim, err := pglimit.New(pool, &c)
				if err != nil {
					return nil, "", err
				}
				do = func(ctx context.Context, key string) (bool, error) {
					d, err := lim.Allow(ctx, key)
					return d.Allowed, err
				}
			}
			if err := r.measure(ctx, do, workers, window, o.keys); err != nil {
				return nil, "", err
			}
			logf("citus: round %d, %s: %.0f/s", round+1, v.name, float64(r.ops)/r.elapsed.Seconds())
		}
	}
	var routerPS, select1PS float64
	for _, r := range results {
		r.ps = float64(r.ops) / r.elapsed.Seconds()
		switch r.name {
		case floorRouter:
			routerPS = r.ps
		case floorSelect1:
			select1PS = r.ps
		}
	}
	for _, r := range results {
		r.ratioRouter, r.ratioSelect1 = r.ps/routerPS, r.ps/select1PS
	}
	return results, settings, nil
}

// measure runs do from workers goroutines on random keys for window, and
// adds what happened to r. An admission of a key is an over-admission when
// it provably came less than the cooldown after the key's previous one:
// it returned less than the cooldown after the previous one was sent.
func (r *citusResult) measure(ctx context.Context, do func(context.Context, string) (bool, error), workers int, window time.Duration, keys int) error {
	type span struct{ sent, received time.Time }
	var (
		mu    sync.Mutex
		last  = map[string]span{}
		ops   atomic.Int64
		adm   atomic.Int64
		errs  atomic.Int64
		overs atomic.Int64
		lats  = make([][]time.Duration, workers)
		wg    sync.WaitGroup
	)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	deadline := start.Add(window)
	for w := range workers {
		wg.Go(func() {
			for time.Now().Before(deadline) && ctx.Err() == nil {
				key := fmt.Sprintf("u%d", rand.IntN(keys))
				sent := time.Now()
				admitted, err := do(ctx, key)
				received := time.Now()
				ops.Add(1)
				lats[w] = append(lats[w], received.Sub(sent))
				if err != nil {
					if errs.Add(1) == 1 {
						mu.Lock()
						r.firstErr = err
						mu.Unlock()
					}
					continue
				}
				if !admitted {
					continue
				}
				adm.Add(1)
				mu.Lock()
				if prev, ok := last[key]; ok && received.Sub(prev.sent) < citusCooldown {
					overs.Add(1)
				}
				last[key] = span{sent, received}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	r.elapsed += time.Since(start)
	r.ops += ops.Load()
	r.admitted += adm.Load()
	r.errs += errs.Load()
	r.overs += overs.Load()
	for _, l := range lats {
		r.latencies = append(r.latencies, l...)
	}
	return ctx.Err()
}
