package pglimit_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/internal/testdb"
	"github.com/pglimit/cooldown/pglimit"
)

// deadlineSlack is how late past its deadline a test accepts a call: the
// library returns within milliseconds of it (docs/operations.md, "Bounds
// every call keeps"), and the rest is room for a loaded 2-core machine
// under the race detector.
const deadlineSlack = 500 * time.Millisecond

// mechanisms are limiter configurations that together turn on every
// mechanism a decision can go through: batching and same-key merging (a
// single GCRA limit, whose keys have room left, so that a call waits for
// a locked row rather than being refused by reading it), leases (a fast limit with a burst), flights and the general
// statement (several limits), per-key limits, and the fallback.
var mechanisms = []struct {
	name string
	cfg  pglimit.Config
}{
	{"gcra", pglimit.Config{Limits: []pglimit.Limit{{Rate: 1, Period: time.Hour, Burst: 100}}}},
	{"gcra nowait", pglimit.Config{Strategy: pglimit.NoWait, Limits: []pglimit.Limit{{Rate: 1, Period: time.Hour, Burst: 100}}}},
	{"leases", pglimit.Config{Limits: []pglimit.Limit{{Rate: 10000, Period: time.Second, Burst: 100}}}},
	{"two limits", pglimit.Config{Limits: []pglimit.Limit{
		{Name: "rate", Rate: 5, Period: time.Minute, Burst: 3},
		{Name: "daily", Algorithm: pglimit.FixedWindow, Rate: 1000, Period: 24 * time.Hour},
	}}},
	{"overrides", pglimit.Config{Namespace: "overrides", Overrides: true, Limits: []pglimit.Limit{{Name: "rate", Rate: 10, Period: time.Second, Burst: 5}}}},
	{"fallback", pglimit.Config{Limits: []pglimit.Limit{{Rate: 1, Period: time.Hour, Burst: 100}}, Fallback: &pglimit.Fallback{Limits: []pglimit.Limit{{Rate: 1, Period: time.Second}}}}},
}

// lockKey holds key's row in schema's table, and its per-key limits' row
// if it has one, in a transaction of its own until the test ends or the
// returned function is called.
func lockKey(t *testing.T, pool *pgxpool.Pool, schema string, s pglimit.Strategy, key string) (release func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() { once.Do(func() { _ = tx.Rollback(ctx) }) }
	t.Cleanup(release)
	table := pgx.Identifier{schema, "pglimit_" + string(s)}.Sanitize()
	var n int
	if err := tx.QueryRow(ctx, "SELECT count(*) FROM (SELECT 1 FROM "+table+" WHERE key = $1 FOR UPDATE) AS l", key).Scan(&n); err != nil || n != 1 {
		t.Fatalf("lock the row of %s: %d rows, %v", key, n, err)
	}
	if _, err := tx.Exec(ctx, "SELECT 1 FROM "+pgx.Identifier{schema, "pglimit_overrides"}.Sanitize()+" WHERE key = $1 FOR UPDATE", key); err != nil {
		t.Fatal(err)
	}
	return release
}

// entryPoints are the limiter's public calls that reach a key's row, each
// as one call on key; a returns a decision admitted before the row was
// locked, for Refund.
func entryPoints(lim pglimit.Limiter, pool *pgxpool.Pool, cfg *pglimit.Config) map[string]func(ctx context.Context, key string, admitted pglimit.Decision) error {
	gcra := cfg.Limits == nil || cfg.Limits[0].Algorithm == pglimit.GCRA && len(cfg.Limits) == 1
	calls := map[string]func(ctx context.Context, key string, admitted pglimit.Decision) error{
		"Allow": func(ctx context.Context, key string, _ pglimit.Decision) error {
			_, err := lim.Allow(ctx, key)
			return err
		},
		"AllowTx": func(ctx context.Context, key string, _ pglimit.Decision) error {
			tx, err := pool.Begin(context.Background())
			if err != nil {
				return err
			}
			defer tx.Rollback(context.Background()) //nolint:errcheck // a rollback of a failed tx may fail
			_, err = lim.AllowTx(ctx, tx, key)
			return err
		},
		"AllowAtMost": func(ctx context.Context, key string, _ pglimit.Decision) error {
			_, err := lim.AllowAtMost(ctx, key, 2)
			return err
		},
		"Peek": func(ctx context.Context, key string, _ pglimit.Decision) error {
			_, err := lim.Peek(ctx, key, 1)
			return err
		},
		"Reset": func(ctx context.Context, key string, _ pglimit.Decision) error {
			return lim.Reset(ctx, key)
		},
	}
	if cfg.Strategy != pglimit.Range {
		calls["Refund"] = func(ctx context.Context, _ string, d pglimit.Decision) error {
			if d.Fallback {
				return nil // decided in process: nothing to give back
			}
			_, err := lim.Refund(ctx, d, 1)
			if errors.Is(err, pglimit.ErrUnsupported) || errors.Is(err, pglimit.ErrInvalidCost) {
				// Units served from a lease, or the decision's one unit
				// reserved by a concurrent refund or counted as given back
				// by one that timed out: no statement.
				return nil
			}
			return err
		}
	}
	if gcra && cfg.Strategy != pglimit.Range {
		calls["Reserve"] = func(ctx context.Context, key string, _ pglimit.Decision) error {
			_, err := lim.Reserve(ctx, key, 1, time.Hour)
			return err
		}
	}
	if cfg.Overrides {
		calls["SetKeyLimits"] = func(ctx context.Context, key string, _ pglimit.Decision) error {
			return pglimit.SetKeyLimits(ctx, pool, cfg, key, pglimit.Limit{Name: "rate", Rate: 20, Burst: 5})
		}
	}
	return calls
}

// The deadline invariant, under a key's row locked by a long transaction:
// no entry point, with any mechanism on, returns later than its context's
// deadline plus deadlineSlack, and one that does not decide in time says
// so with the context's error, or ErrTimeout when Timeout came first.
func TestDeadlineLockedRow(t *testing.T) {
	t.Parallel()
	for _, m := range mechanisms {
		for _, bound := range []string{"context", "Timeout"} {
			t.Run(m.name+"/"+bound, func(t *testing.T) {
				t.Parallel()
				pool := bigPool(t, 32)
				cfg := m.cfg
				cfg.Schema = testdb.Schema(t)
				limit, want := 100*time.Millisecond, context.DeadlineExceeded
				if bound == "Timeout" {
					cfg.Timeout, want = limit, pglimit.ErrTimeout
				}
				lim, err := pglimit.New(pool, &cfg)
				if err != nil {
					t.Fatal(err)
				}
				// The keys' rows are made by a limiter that decides on the
				// database alone, in no hurry.
				setup := m.cfg
				setup.Schema, setup.Fallback = cfg.Schema, nil
				first, err := pglimit.New(pool, &setup)
				if err != nil {
					t.Fatal(err)
				}
				var worst lateness
				defer func() { t.Logf("latest return past the deadline: %s", &worst) }()
				for name, call := range entryPoints(lim, pool, &cfg) {
					key := "k-" + name
					if cfg.Overrides {
						if err := pglimit.SetKeyLimits(t.Context(), pool, &cfg, key, pglimit.Limit{Name: "rate", Rate: 10, Burst: 4}); err != nil {
							t.Fatal(err)
						}
					}
					if d, err := first.Allow(t.Context(), key); err != nil || !d.Allowed {
						t.Fatalf("%s: first Allow: %+v, %v", name, d, err)
					}
					d, err := lim.Allow(t.Context(), key) // Refund's
					if err != nil || !d.Allowed {
						t.Fatalf("%s: second Allow: %+v, %v", name, d, err)
					}
					lockKey(t, pool, cfg.Schema, cmpStrategy(cfg.Strategy), key)
					// Five calls at once, twice: calls that meet on a key
					// merge, and a busy key of a fast limit leases.
					var wg sync.WaitGroup
					for range 2 {
						for range 5 {
							wg.Go(func() {
								ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
								if bound == "context" {
									ctx, cancel = context.WithTimeout(t.Context(), limit)
								}
								defer cancel()
								start := time.Now()
								err := call(ctx, key, d)
								took := time.Since(start)
								worst.note(name, took-limit)
								if took > limit+deadlineSlack {
									t.Errorf("%s returned after %s, deadline %s (err %v)", name, took.Round(time.Millisecond), limit, err)
								}
								if err != nil && !errors.Is(err, want) {
									t.Errorf("%s: %v, want an error wrapping %v", name, err, want)
								}
							})
						}
						wg.Wait()
					}
				}
			})
		}
	}
}

// lateness is the most a call returned past its deadline.
type lateness struct {
	mu   sync.Mutex
	max  time.Duration
	name string
}

func (l *lateness) note(name string, d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if d > l.max {
		l.max, l.name = d, name
	}
}

func (l *lateness) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return fmt.Sprintf("%s (%s)", l.max.Round(time.Millisecond), l.name)
}

func cmpStrategy(s pglimit.Strategy) pglimit.Strategy {
	if s == "" {
		return pglimit.Upsert
	}
	return s
}

// One key whose row a long transaction holds keeps no other key of its
// batch waiting: a key freed after 600 ms is decided then, while the held
// one is still waited for.
func TestBatchSlowKeyHoldsNoOther(t *testing.T) {
	t.Parallel()
	pool := bigPool(t, 16)
	lim, schema := newBatchLimiter(t, pool, pglimit.Upsert, func(c *pglimit.Config) {
		c.Limits, c.Cooldown = []pglimit.Limit{{Rate: 1, Period: time.Hour, Burst: 10}}, 0
	})
	keys := []string{"fill-1", "fill-2", "slow", "quick"}
	for _, k := range keys {
		if _, err := lim.Allow(t.Context(), k); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range []string{"fill-1", "fill-2", "slow"} {
		lockKey(t, pool, schema, pglimit.Upsert, k)
	}
	freeQuick := lockKey(t, pool, schema, pglimit.Upsert, "quick")
	// The two fillers hold the statements in flight, so that the next two
	// calls gather in one batch, sent when the fillers give up.
	var wg sync.WaitGroup
	for _, k := range keys[:2] {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
			defer cancel()
			_, _ = lim.Allow(ctx, k)
		})
	}
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	wg.Go(func() {
		if _, err := lim.Allow(t.Context(), "slow"); !errors.Is(err, pglimit.ErrTimeout) {
			t.Errorf("slow: %v, want ErrTimeout", err)
		}
	})
	var quick time.Duration
	wg.Go(func() {
		d, err := lim.Allow(t.Context(), "quick")
		quick = time.Since(start)
		if err != nil || !d.Allowed {
			t.Errorf("quick: %+v, %v; want it admitted", d, err)
		}
	})
	time.Sleep(600 * time.Millisecond)
	freeQuick()
	wg.Wait()
	// The slow key's wait ends at Timeout, 2 s after the batch was sent.
	if quick > time.Second+deadlineSlack {
		t.Errorf("the quick key was decided after %s, behind the slow one; its row was free after 600 ms", quick.Round(time.Millisecond))
	}
}

// A lock_timeout or statement_timeout that the server enforces (a default
// of the database or role) is ErrTimeout, as the limiter's own is.
func TestServerTimeoutIsErrTimeout(t *testing.T) {
	t.Parallel()
	for _, setting := range []string{"lock_timeout", "statement_timeout"} {
		for _, m := range mechanisms {
			if m.cfg.Strategy == pglimit.NoWait {
				continue // a lock it cannot have at once is a refusal
			}
			t.Run(fmt.Sprintf("%s/%s", setting, m.name), func(t *testing.T) {
				t.Parallel()
				pcfg, err := pgxpool.ParseConfig(testdb.URL(t))
				if err != nil {
					t.Fatal(err)
				}
				pcfg.ConnConfig.RuntimeParams["search_path"] = ""
				pcfg.ConnConfig.RuntimeParams[setting] = "300ms"
				pool, err := pgxpool.NewWithConfig(t.Context(), pcfg)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(pool.Close)
				cfg := m.cfg
				cfg.Schema, cfg.Fallback = testdb.Schema(t), nil
				lim, err := pglimit.New(pool, &cfg)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := lim.Allow(t.Context(), "k"); err != nil {
					t.Fatal(err)
				}
				lockKey(t, bigPool(t, 2), cfg.Schema, pglimit.Upsert, "k")
				if _, err := lim.Allow(t.Context(), "k"); !errors.Is(err, pglimit.ErrTimeout) {
					t.Errorf("Allow on a locked row under the server's %s: %v, want ErrTimeout", setting, err)
				}
				if err := lim.Reset(t.Context(), "k"); !errors.Is(err, pglimit.ErrTimeout) {
					t.Errorf("Reset of a locked row under the server's %s: %v, want ErrTimeout", setting, err)
				}
			})
		}
	}
}

// At-most-once charging. Every commit waits for a synchronous standby
// that never comes, and each backend that waits is terminated: its
// transaction has committed locally, and its client gets an error. The
// database's record then shows each caller charged at most once: a batch
// whose statement may have committed is never run again by its callers.
func TestChargedAtMostOnce(t *testing.T) {
	testdb.Slow(t)
	ctx := t.Context()
	srv := testdb.OwnServer(t)
	admin := testdb.ServerPool(t, srv, 2)
	pool := testdb.ServerPool(t, srv, 16)
	if err := pglimit.Migrate(ctx, admin, "public"); err != nil {
		t.Fatal(err)
	}
	burst := 1000
	lim, err := pglimit.New(pool, &pglimit.Config{Limits: []pglimit.Limit{{Rate: 1, Period: time.Hour, Burst: burst}}})
	if err != nil {
		t.Fatal(err)
	}
	syncRep := func(names string) {
		t.Helper()
		if _, err := admin.Exec(ctx, "ALTER SYSTEM SET synchronous_standby_names = '"+names+"'"); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
			t.Fatal(err)
		}
	}
	syncRep("nobody")
	stop := make(chan struct{})
	var terminator sync.WaitGroup
	var terminated int
	terminator.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			var n int
			if err := admin.QueryRow(ctx, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE wait_event = 'SyncRep'").Scan(&n); err != nil {
				t.Error(err)
				return
			}
			terminated += n
		}
	})
	keys := []string{"a", "b", "c", "d"}
	var (
		mu       sync.Mutex
		callers  = map[string]int{}
		admitted = map[string]int{}
		failed   int
		wg       sync.WaitGroup
	)
	for i := range 64 {
		key := keys[i%len(keys)]
		wg.Go(func() {
			d, err := lim.Allow(ctx, key)
			mu.Lock()
			defer mu.Unlock()
			callers[key]++
			switch {
			case err != nil:
				if failed++; failed <= 3 {
					t.Logf("%s: %v", key, err)
				}
			case d.Allowed:
				admitted[key]++
			}
		})
	}
	wg.Wait()
	close(stop)
	terminator.Wait()
	syncRep("")
	if terminated == 0 {
		t.Fatal("no backend was terminated while its commit waited: the test proves nothing")
	}
	for _, key := range keys {
		d, err := lim.Peek(ctx, key, 1)
		if err != nil {
			t.Fatal(err)
		}
		charged := burst - 1 - d.Remaining // Peek's Remaining counts its own unit as taken
		t.Logf("key %s: %d callers, %d admitted, %d units charged", key, callers[key], admitted[key], charged)
		if charged > callers[key] || charged < admitted[key] {
			t.Errorf("key %s: %d units charged for %d callers (%d admitted); each caller is charged at most once", key, charged, callers[key], admitted[key])
		}
	}
	t.Logf("%d backends terminated at their commit; %d callers got an error", terminated, failed)
}
