package pglimit_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
)

// hangBound is how long a decision may take in a fault test before it
// counts as a hang. It is far above every configured timeout, so a loaded
// machine does not fail the tests; the latencies actually seen are logged.
const hangBound = 10 * time.Second

// load runs workers that call Allow on distinct keys until ctx ends, and
// records the slowest decision and the outcome counts.
type load struct {
	slowest            atomic.Int64 // nanoseconds
	ok, errs, timeouts atomic.Int64
	lastErr            atomic.Value
}

func (l *load) run(ctx context.Context, lim pglimit.Limiter, workers int) *sync.WaitGroup {
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				start := time.Now()
				_, err := lim.Allow(context.Background(), fmt.Sprintf("w%d-%d", w, i))
				took := time.Since(start)
				for {
					old := l.slowest.Load()
					if int64(took) <= old || l.slowest.CompareAndSwap(old, int64(took)) {
						break
					}
				}
				switch {
				case err == nil:
					l.ok.Add(1)
				case errors.Is(err, pglimit.ErrTimeout):
					l.timeouts.Add(1)
				default:
					l.errs.Add(1)
					l.lastErr.Store(err.Error())
				}
				time.Sleep(time.Millisecond)
			}
		})
	}
	return &wg
}

// waitHealthy polls until lim decides without error, or fails the test.
func waitHealthy(t *testing.T, lim pglimit.Limiter, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	var err error
	for time.Since(start) < within {
		if _, err = lim.Allow(context.Background(), fmt.Sprintf("probe-%d", time.Now().UnixNano())); err == nil {
			return time.Since(start)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("no successful decision within %s after the fault: %v", within, err)
	return 0
}

// The database restarts (fast shutdown) or crashes mid-load, or every
// connection is terminated: decisions stay bounded by Config.Timeout during
// the outage, the limiter recovers by itself, and the pool is left with no
// connection stuck in use.
func TestRecoversFromOutages(t *testing.T) {
	testdb.Slow(t)
	t.Parallel()
	srv := testdb.OwnServer(t)
	admin := testdb.ServerPool(t, srv, 2)
	ctx := context.Background()
	if err := pglimit.Migrate(ctx, admin, "public"); err != nil {
		t.Fatal(err)
	}
	const timeout = 500 * time.Millisecond
	faults := []struct {
		name   string
		inject func() error
	}{
		{"restart", func() error { return srv.Restart(ctx, false) }},
		{"crash", func() error { return srv.Restart(ctx, true) }},
		{"terminate connections", func() error {
			_, err := admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
				WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()`)
			return err
		}},
	}
	for _, s := range pglimit.Strategies() {
		for _, fault := range faults {
			pool := testdb.ServerPool(t, srv, 4)
			lim, err := pglimit.New(pool, &pglimit.Config{Strategy: s, Namespace: string(s) + fault.name, Cooldown: time.Minute, Timeout: timeout})
			if err != nil {
				t.Fatal(err)
			}
			waitHealthy(t, lim, hangBound)

			var l load
			loadCtx, stop := context.WithCancel(ctx)
			wg := l.run(loadCtx, lim, 4)
			time.Sleep(200 * time.Millisecond)
			if err := fault.inject(); err != nil {
				stop()
				wg.Wait()
				t.Fatalf("%s: inject %s: %v", s, fault.name, err)
			}
			recovered := waitHealthy(t, lim, 30*time.Second)
			time.Sleep(200 * time.Millisecond)
			stop()
			wg.Wait()

			slowest := time.Duration(l.slowest.Load())
			t.Logf("%s / %s: slowest decision %s (Timeout %s), recovered %s after the fault; %d decided, %d timeouts, %d other errors (last: %v)",
				s, fault.name, slowest.Round(time.Millisecond), timeout, recovered.Round(time.Millisecond),
				l.ok.Load(), l.timeouts.Load(), l.errs.Load(), l.lastErr.Load())
			if slowest > hangBound {
				t.Errorf("%s / %s: a decision took %s", s, fault.name, slowest)
			}
			if n := pool.Stat().AcquiredConns(); n != 0 {
				t.Errorf("%s / %s: %d connections still acquired after the load stopped", s, fault.name, n)
			}
			pool.Close()
		}
	}
}

// A decision on a key that another session holds gives up at
// Config.Timeout with ErrTimeout (NoWait refuses at once), and the
// connections it ran on are usable afterwards. For Upsert and NoWait the
// other session locks the key's row, whose cooldown has ended; for Range it
// has an uncommitted admission of the key in its transaction.
func TestTimeoutOnHeldKeyLeavesPoolHealthy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, s := range pglimit.Strategies() {
		t.Run(string(s), func(t *testing.T) {
			t.Parallel()
			schema := testdb.Schema(t)
			holder := testdb.Pool(t)
			pool := testdb.Pool(t)
			// Range waits only on an overlapping range: a long cooldown.
			cooldown := time.Millisecond
			if s == pglimit.Range {
				cooldown = time.Minute
			}
			lim, err := pglimit.New(pool, &pglimit.Config{Strategy: s, Schema: schema, Cooldown: cooldown, Timeout: 500 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			// The same table and pool with the default Timeout, for the steps
			// that check set-up and health rather than the bound.
			healthy, err := pglimit.New(pool, &pglimit.Config{Strategy: s, Schema: schema, Cooldown: cooldown})
			if err != nil {
				t.Fatal(err)
			}
			tx, err := holder.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			if s == pglimit.Range {
				if d, err := healthy.AllowTx(ctx, tx, "k"); err != nil || !d.Allowed {
					t.Fatalf("AllowTx: %+v, %v", d, err)
				}
			} else {
				if d, err := healthy.Allow(ctx, "k"); err != nil || !d.Allowed {
					t.Fatalf("Allow: %+v, %v", d, err)
				}
				time.Sleep(5 * time.Millisecond) // past the 1ms cooldown
				table := pgx.Identifier{schema, "pglimit_" + string(s)}.Sanitize()
				if _, err := tx.Exec(ctx, "SELECT FROM "+table+" WHERE key = 'k' FOR UPDATE"); err != nil {
					t.Fatal(err)
				}
			}
			refusals := 0
			for i := range 8 { // more than the pool's connections
				start := time.Now()
				d, err := lim.Allow(ctx, "k")
				took := time.Since(start)
				if took > hangBound {
					t.Fatalf("decision %d took %s", i, took)
				}
				switch {
				case err == nil && d.Allowed:
					t.Fatalf("decision %d admitted a held key", i)
				case err == nil:
					refusals++
				case !errors.Is(err, pglimit.ErrTimeout):
					t.Fatalf("decision %d: %v; want ErrTimeout or a refusal", i, err)
				}
			}
			// NoWait refuses without waiting (a loaded machine may still
			// miss the bound once); the others wait and time out.
			if s == pglimit.NoWait && refusals < 6 || s != pglimit.NoWait && refusals != 0 {
				t.Fatalf("%d of 8 decisions refused at once", refusals)
			}
			for i := range 8 {
				if d, err := healthy.Allow(ctx, fmt.Sprintf("other-%d", i)); err != nil || !d.Allowed {
					t.Fatalf("other key %d after the timeouts: %+v, %v", i, d, err)
				}
			}
		})
	}
}

// More callers than connections: waits for a connection count against the
// decision's bound, and a caller that holds a connection in its own
// transaction while calling AllowTx cannot deadlock with the pool.
func TestPoolExhaustion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := testdb.Schema(t)
	cfg, err := pgxpool.ParseConfig(testdb.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	lim, err := pglimit.New(pool, &pglimit.Config{Schema: schema, Cooldown: time.Minute, Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}

	// Both connections are held by application transactions, each deciding
	// inside itself: no connection is left for Allow.
	var txs []pgx.Tx
	for i := range 2 {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if d, err := lim.AllowTx(ctx, tx, fmt.Sprintf("tx-%d", i)); err != nil || !d.Allowed {
			t.Fatalf("AllowTx on a saturated pool: %+v, %v", d, err)
		}
		txs = append(txs, tx)
	}
	start := time.Now()
	_, err = lim.Allow(ctx, "starved")
	if took := time.Since(start); took > hangBound {
		t.Fatalf("Allow on an exhausted pool took %s", took)
	}
	if !errors.Is(err, pglimit.ErrTimeout) {
		t.Fatalf("Allow on an exhausted pool: %v, want ErrTimeout", err)
	}
	for _, tx := range txs {
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// waitHealthy, not one call: the 300ms Timeout is short for a loaded
	// machine, and this checks that the pool is free again.
	waitHealthy(t, lim, hangBound)
}

// A database crash in the middle of admissions: every admission the
// limiter acknowledged before the crash is still in force after it with
// durable commits. With AsyncCommit, the last admissions before the crash
// may be lost; the test reports how many.
func TestCrashKeepsAcknowledgedAdmissions(t *testing.T) {
	testdb.Slow(t)
	t.Parallel()
	srv := testdb.OwnServer(t)
	ctx := context.Background()
	admin := testdb.ServerPool(t, srv, 2)
	if err := pglimit.Migrate(ctx, admin, "public"); err != nil {
		t.Fatal(err)
	}
	for _, s := range pglimit.Strategies() {
		for _, async := range []bool{false, true} {
			pool := testdb.ServerPool(t, srv, 8)
			ns := fmt.Sprintf("%s-async-%t", s, async)
			lim, err := pglimit.New(pool, &pglimit.Config{Strategy: s, Namespace: ns, Cooldown: time.Hour, Timeout: time.Second, AsyncCommit: async})
			if err != nil {
				t.Fatal(err)
			}
			waitHealthy(t, lim, hangBound)

			var (
				mu    sync.Mutex
				acked []string
				wg    sync.WaitGroup
				next  atomic.Int64
			)
			loadCtx, stop := context.WithCancel(ctx)
			for range 8 {
				wg.Go(func() {
					for loadCtx.Err() == nil {
						key := fmt.Sprintf("k%d", next.Add(1))
						if d, err := lim.Allow(ctx, key); err == nil && d.Allowed {
							mu.Lock()
							acked = append(acked, key)
							mu.Unlock()
						}
					}
				})
			}
			time.Sleep(time.Second)
			if err := srv.Restart(ctx, true); err != nil {
				t.Fatal(err)
			}
			stop()
			wg.Wait()
			waitHealthy(t, lim, 30*time.Second)

			again := 0
			for _, key := range acked {
				d, err := lim.Allow(ctx, key)
				if err != nil {
					t.Fatalf("%s: after the crash: %v", ns, err)
				}
				if d.Allowed {
					again++
				}
			}
			t.Logf("%s: %d admissions acknowledged before the crash, %d admitted again after it", ns, len(acked), again)
			if len(acked) == 0 {
				t.Fatalf("%s: no admission before the crash", ns)
			}
			if !async && again != 0 {
				t.Errorf("%s: %d acknowledged admissions were lost in the crash with durable commits", ns, again)
			}
			pool.Close()
		}
	}
}
