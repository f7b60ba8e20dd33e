package pglimit_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimittest"
)

// envCitusURL names a Citus cluster's coordinator for the Citus tests.
const envCitusURL = "PGLIMIT_TEST_CITUS_URL"

// citusURL returns the coordinator's URL, with a small shard count so that
// each test's schema distributes quickly (decisions do not depend on it).
// Citus is not packaged for the CI machines, so without the variable the
// test is skipped, in CI too, saying how to provide a cluster.
func citusURL(t *testing.T) string {
	t.Helper()
	raw := os.Getenv(envCitusURL)
	if raw == "" {
		t.Skipf("%s is not set: set it to the URL of a Citus 12+ cluster's coordinator (PostgreSQL 15+, a superuser, "+
			"workers registered with citus_add_node), e.g. postgres://postgres@127.0.0.1:9700/postgres; docs/citus.md says how pglimit runs there", envCitusURL)
	}
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("%s: %v", envCitusURL, err)
	}
	q := u.Query()
	q.Set("citus.shard_count", "4")
	u.RawQuery = q.Encode()
	return u.String()
}

// citusPool returns a pool of n connections to the coordinator, with an
// empty search_path, closed when the test ends.
func citusPool(t *testing.T, n int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(citusURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = n
	cfg.ConnConfig.RuntimeParams["search_path"] = ""
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// citusSchema migrates and distributes a schema of its own on the cluster,
// dropped when the test ends.
func citusSchema(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "pglimit_citus_" + hex.EncodeToString(b[:])
	ctx := context.Background()
	if err := pglimit.Migrate(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	if err := pglimit.Distribute(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	return schema
}

// The whole conformance suite, on tables distributed by key, for every
// strategy and both commit modes.
func TestCitusConformance(t *testing.T) {
	t.Parallel()
	url := citusURL(t)
	for _, s := range pglimit.Strategies() {
		for _, async := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/async=%t", s, async), func(t *testing.T) {
				t.Parallel()
				pglimittest.Exercise(t, withStrategy(s, func(c *pglimit.Config) { c.AsyncCommit = async }),
					pglimittest.OnServer(url, pglimit.Distribute))
			})
		}
	}
}

// Distribute is idempotent, and a limiter on a distributed table of a
// schema that Distribute has not seen fails with ErrUnsupported, naming
// the fix, instead of deciding over several hops.
func TestCitusDistribute(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := citusPool(t, 4)
	schema := citusSchema(t, pool)
	if err := pglimit.Distribute(ctx, pool, schema); err != nil {
		t.Fatalf("second Distribute: %v", err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_dist_partition WHERE logicalrelid::text LIKE $1 || '.%'`, schema).Scan(&n); err != nil || n != 5 {
		t.Fatalf("%d distributed tables, %v; want 5", n, err)
	}

	if _, err := pool.Exec(ctx, "DROP FUNCTION "+schema+".pglimit_upsert_allow"); err != nil {
		t.Fatal(err)
	}
	lim, err := pglimit.New(pool, &pglimit.Config{Schema: schema, Cooldown: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if d, err := lim.Allow(ctx, "k"); !errors.Is(err, pglimit.ErrUnsupported) || !strings.Contains(err.Error(), "Distribute") || d.Allowed {
		t.Fatalf("Allow without the functions: %+v, %v; want ErrUnsupported naming Distribute", d, err)
	}
	if err := pglimit.Distribute(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	lim, err = pglimit.New(pool, &pglimit.Config{Schema: schema, Cooldown: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if d, err := lim.Allow(ctx, "k"); err != nil || !d.Allowed {
		t.Fatalf("Allow after Distribute again: %+v, %v", d, err)
	}
}

// On plain PostgreSQL, Distribute says that Citus is missing and changes
// nothing.
func TestDistributeWithoutCitus(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := testdb.Pool(t), testdb.Schema(t)
	if err := pglimit.Distribute(ctx, pool, schema); !errors.Is(err, pglimit.ErrUnsupported) {
		t.Fatalf("Distribute: %v; want ErrUnsupported", err)
	}
	if err := pglimit.Distribute(ctx, pool, "Bad"); !errors.Is(err, pglimit.ErrInvalidConfig) {
		t.Fatalf("Distribute on a bad schema name: %v; want ErrInvalidConfig", err)
	}
	lim, err := pglimit.New(pool, &pglimit.Config{Schema: schema, Cooldown: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if d, err := lim.Allow(ctx, "k"); err != nil || !d.Allowed {
		t.Fatalf("Allow after the refused Distribute: %+v, %v", d, err)
	}
}

// Each decision Citus plans as one task delegated to the key's node, with
// no subplan: EXPLAIN of the statement the limiter sends, for each
// strategy, statement and transaction mode.
func TestCitusDecisionIsOneTask(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := citusPool(t, 2)
	schema := citusSchema(t, pool)
	for _, s := range pglimit.Strategies() {
		for _, general := range []bool{false, true} {
			if general && s == pglimit.Range {
				continue
			}
			cfg := &pglimit.Config{Strategy: s, Schema: schema, Cooldown: time.Minute}
			if general {
				cfg.Cooldown, cfg.Limits = 0, []pglimit.Limit{pglimit.PerMinute(5), {Rate: 20, Period: time.Hour, Algorithm: pglimit.FixedWindow}}
			}
			lim, err := pglimit.New(pool, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := lim.Allow(ctx, "k"); err != nil { // finds out that the table is distributed
				t.Fatal(err)
			}
			for _, inTx := range []bool{false, true} {
				sql, args := pglimit.DecisionStatement(lim, "k", general, inTx)
				plan := explain(t, pool, sql, args, inTx)
				if !strings.Contains(plan, "Task Count: 1") || strings.Contains(plan, "Distributed Subplan") {
					t.Errorf("%s general=%t inTx=%t: want a single task and no subplan:\n%s", s, general, inTx, plan)
				}
				if s == pglimit.Upsert && !general && !inTx {
					t.Logf("EXPLAIN of an Upsert cooldown decision:\n%s", plan)
				}
			}
		}
	}
}

func explain(t *testing.T, pool *pgxpool.Pool, sql string, args []any, inTx bool) string {
	t.Helper()
	ctx := context.Background()
	var q interface {
		Query(context.Context, string, ...any) (pgx.Rows, error)
	} = pool
	if inTx {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		q = tx
	}
	rows, err := q.Query(ctx, "EXPLAIN (COSTS OFF) "+sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}

// Each strategy's decisions per second on many keys, 8 workers, beside the
// cluster's router floor (a SELECT of one key's row through the
// coordinator) measured in the same test on the same pool. Logged, never
// asserted: the machine is shared. What is asserted: no key admitted twice
// within its cooldown.
func TestCitusThroughput(t *testing.T) {
	ctx := context.Background()
	const workers = 8
	pool := citusPool(t, workers)
	schema := citusSchema(t, pool)
	const window = 2 * time.Second
	run := func(do func(ctx context.Context, key string) error) float64 {
		var n atomic.Int64
		var wg sync.WaitGroup
		var failed atomic.Pointer[error]
		deadline := time.Now().Add(window)
		for w := range workers {
			wg.Go(func() {
				for i := 0; time.Now().Before(deadline); i++ {
					if err := do(ctx, fmt.Sprintf("w%d-%d", w, i)); err != nil {
						failed.Store(&err)
						return
					}
					n.Add(1)
				}
			})
		}
		wg.Wait()
		if err := failed.Load(); err != nil {
			t.Fatal(*err)
		}
		return float64(n.Load()) / window.Seconds()
	}
	router := fmt.Sprintf("SELECT expires_at FROM %s.pglimit_upsert WHERE namespace = $1 AND key = $2", schema)
	floor := run(func(ctx context.Context, key string) error {
		_, err := pool.Exec(ctx, router, "tp", key)
		return err
	})
	t.Logf("router floor: %.0f SELECTs/s", floor)
	for _, s := range pglimit.Strategies() {
		lim, err := pglimit.New(pool, &pglimit.Config{Strategy: s, Schema: schema, Namespace: "tp", Cooldown: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		var twice atomic.Int64
		rate := run(func(ctx context.Context, key string) error {
			d, err := lim.Allow(ctx, key)
			if err != nil {
				return err
			}
			if d2, err := lim.Allow(ctx, key); err != nil || d2.Allowed || !d.Allowed {
				twice.Add(1)
			}
			return err
		}) * 2
		t.Logf("%s: %.0f decisions/s, x router floor %.2f", s, rate, rate/floor)
		if n := twice.Load(); n > 0 {
			t.Errorf("%s: %d keys not admitted exactly once (first request admitted, second refused)", s, n)
		}
	}
}

// A refusal reads the key's row without locking it: with the row held
// locked by another transaction, a request for a key in cooldown is
// refused at once, neither waiting nor (NoWait) treating the lock as
// contention. Taking no lock, it writes nothing.
func TestCitusRefusalTakesNoLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := citusPool(t, 4)
	schema := citusSchema(t, pool)
	for _, s := range pglimit.Strategies() {
		lim, err := pglimit.New(pool, &pglimit.Config{Strategy: s, Schema: schema, Cooldown: time.Minute, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if d, err := lim.Allow(ctx, "hot"); err != nil || !d.Allowed {
			t.Fatalf("%s: first request: %+v, %v", s, d, err)
		}
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, fmt.Sprintf("SELECT FROM %s.%s WHERE key = 'hot' FOR UPDATE", schema, tableOf(s))); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		d, err := lim.Allow(ctx, "hot")
		took := time.Since(start)
		_ = tx.Rollback(ctx)
		if err != nil || d.Allowed || d.RetryAfter <= 30*time.Second {
			t.Fatalf("%s: refusal with the row locked elsewhere: %+v, %v; want refused with the cooldown's RetryAfter", s, d, err)
		}
		if took > 2*time.Second {
			t.Fatalf("%s: the refusal took %s with the row locked elsewhere: it waited for the lock", s, took)
		}
	}
}

// General limits decide on a distributed table as on one server: several
// limits all-or-nothing, AllowAtMost, Reserve, Peek, Reset, and AllowTx
// consumed only on commit.
func TestCitusGeneralLimits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := citusPool(t, 4)
	schema := citusSchema(t, pool)
	for _, s := range []pglimit.Strategy{pglimit.Upsert, pglimit.NoWait} {
		t.Run(string(s), func(t *testing.T) {
			lim, err := pglimit.New(pool, &pglimit.Config{Strategy: s, Schema: schema, Limits: []pglimit.Limit{
				{Name: "burst", Rate: 3, Period: time.Minute, Burst: 3},
				{Name: "window", Rate: 5, Period: time.Hour, Algorithm: pglimit.FixedWindow},
			}})
			if err != nil {
				t.Fatal(err)
			}
			step := func(what string, d pglimit.Decision, err error, allowed bool, granted int) {
				t.Helper()
				if err != nil || d.Allowed != allowed || d.Granted != granted {
					t.Fatalf("%s: %+v, %v; want Allowed %t, Granted %d", what, d, err, allowed, granted)
				}
			}
			d, err := lim.AllowN(ctx, "k", 2)
			step("AllowN 2", d, err, true, 2)
			if d.Remaining != 1 || d.Limit.Name != "burst" {
				t.Fatalf("after 2 of 3: Remaining %d, binding %q; want 1, burst", d.Remaining, d.Limit.Name)
			}
			d, err = lim.AllowN(ctx, "k", 2)
			step("AllowN 2 with 1 left", d, err, false, 0)
			if v := d.Violated(); len(v) != 1 || v[0].Name != "burst" || d.RetryAfter <= 0 {
				t.Fatalf("refusal: violated %v, RetryAfter %s; want burst and a wait", v, d.RetryAfter)
			}
			d, err = lim.Peek(ctx, "k", 1)
			step("Peek 1", d, err, true, 1)
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			d, err = lim.AllowTxN(ctx, tx, "k", 1)
			step("AllowTxN 1, rolled back", d, err, true, 1)
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			d, err = lim.AllowAtMost(ctx, "k", 5)
			step("AllowAtMost 5 with 1 left", d, err, true, 1)
			d, err = lim.Allow(ctx, "k")
			step("Allow after a full burst", d, err, false, 0)
			if err := lim.Reset(ctx, "k"); err != nil {
				t.Fatal(err)
			}
			d, err = lim.AllowN(ctx, "k", 3)
			step("AllowN 3 after Reset", d, err, true, 3)

			gcra, err := pglimit.New(pool, &pglimit.Config{Strategy: s, Schema: schema, Namespace: "reserve", Limits: []pglimit.Limit{
				pglimit.PerMinute(3), pglimit.PerHour(100),
			}})
			if err != nil {
				t.Fatal(err)
			}
			d, err = gcra.AllowN(ctx, "k", 3)
			step("AllowN 3 of two GCRA limits", d, err, true, 3)
			d, err = gcra.Reserve(ctx, "k", 1, time.Minute)
			step("Reserve 1 within a minute", d, err, true, 1)
			if d.Delay <= 0 || d.Delay > 20*time.Second {
				t.Fatalf("Reserve: Delay %s; want a wait of up to one emission interval (20s)", d.Delay)
			}
		})
	}
}

// A worker keeps no memory per decision. The function runs on the node
// holding the key's shard in a connection that the coordinator keeps open,
// so whatever the worker's backend keeps per call grows for as long as the
// connection lives. The test calls the function as the coordinator does,
// on that node, over one connection, then reads the backend's cached plans
// (pg_backend_memory_contexts): on Citus 12.1.11+, 13.2.1+ and 14.0 a
// cached generic plan of a statement in a function kept another local plan
// on every execution, 30 to 40 kB a statement, until the connection
// closed.
func TestCitusWorkerMemoryBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := citusPool(t, 2)
	schema := citusSchema(t, pool)
	const calls, bound = 400, 4 << 20
	for _, s := range pglimit.Strategies() {
		for _, general := range []bool{false, true} {
			if general && s == pglimit.Range {
				continue
			}
			// Limits loose enough that most calls admit, so that every
			// statement of the function runs: reads, locks and writes.
			cfg := &pglimit.Config{Strategy: s, Schema: schema, Cooldown: time.Microsecond}
			if general {
				cfg.Cooldown, cfg.Limits = 0, []pglimit.Limit{{Rate: 1_000_000, Period: time.Second}, {Rate: 1_000_000, Period: time.Hour, Algorithm: pglimit.FixedWindow}}
			}
			lim, err := pglimit.New(pool, cfg)
			if err != nil {
				t.Fatal(err)
			}
			key := fmt.Sprintf("mem-%s-%t", s, general)
			if _, err := lim.Allow(ctx, key); err != nil { // finds out that the table is distributed
				t.Fatal(err)
			}
			conn := citusNodeOf(t, pool, schema+"."+tableOf(s), key)
			sql, args := pglimit.DecisionStatement(lim, key, general, false)
			cached := func() int64 {
				var n int64
				if err := conn.QueryRow(ctx, "SELECT coalesce(sum(total_bytes), 0) FROM pg_backend_memory_contexts WHERE name = 'CachedPlan'").Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			}
			run := func(n int) (admitted int) {
				for range n {
					ok := false // no row: the key changed, decide again
					row, err := conn.Query(ctx, sql, args...)
					if err != nil {
						t.Fatal(err)
					}
					for row.Next() {
						v, err := row.Values()
						if err != nil {
							t.Fatal(err)
						}
						ok, _ = v[0].(bool)
					}
					if err := row.Err(); err != nil {
						t.Fatal(err)
					}
					if ok {
						admitted++
					}
				}
				return admitted
			}
			run(20) // past the first executions, which plan afresh anyway
			before := cached()
			if n := run(calls); n < calls/2 {
				t.Fatalf("%s general=%t: %d of %d decisions admitted; want most, so that every statement runs", s, general, n, calls)
			}
			if grew := cached() - before; grew > bound {
				t.Errorf("%s general=%t: the worker's cached plans grew by %d bytes over %d decisions on one connection; want at most %d",
					s, general, grew, calls, bound)
			}
			conn.Close(ctx)
		}
	}
}

// tableOf is the table of strategy s.
func tableOf(s pglimit.Strategy) string {
	return map[pglimit.Strategy]string{pglimit.Upsert: "pglimit_upsert", pglimit.NoWait: "pglimit_nowait", pglimit.Range: "pglimit_range"}[s]
}

// citusNodeOf connects to the node that holds the shard of key in the
// distributed table, with the coordinator's URL and credentials.
func citusNodeOf(t *testing.T, pool *pgxpool.Pool, table, key string) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	var host string
	var port int
	err := pool.QueryRow(ctx, `SELECT nodename, nodeport FROM pg_dist_shard_placement
	                           WHERE shardid = get_shard_id_for_distribution_column($1, $2::text)`, table, key).Scan(&host, &port)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := pgx.ParseConfig(citusURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Host, cfg.Port = host, uint16(port)
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return conn
}
