package pglimit_test

import (
	"context"
	"fmt"
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

// withStrategy returns a constructor for pglimittest.Exercise that builds
// strategy s, with edit applied to the config.
func withStrategy(s pglimit.Strategy, edit func(*pglimit.Config)) pglimittest.NewLimiter {
	return func(db pglimit.DB, cfg *pglimit.Config) (pglimit.Limiter, error) {
		c := *cfg
		c.Strategy = s
		if edit != nil {
			edit(&c)
		}
		return pglimit.New(db, &c)
	}
}

// Every strategy passes the suite with every combination of the options
// that change how it talks to the database.
func TestConformance(t *testing.T) {
	t.Parallel()
	for _, s := range pglimit.Strategies() {
		for _, async := range []bool{false, true} {
			for _, preblock := range []int{0, 1000} {
				t.Run(fmt.Sprintf("%s/async=%t/preblock=%d", s, async, preblock), func(t *testing.T) {
					if async != (preblock > 0) {
						testdb.Slow(t) // the quick tier runs each strategy plain and with both levers
					}
					t.Parallel()
					pglimittest.Exercise(t, withStrategy(s, func(c *pglimit.Config) {
						c.AsyncCommit = async
						c.PreBlockSize = preblock
					}))
				})
			}
		}
	}
}

// A refusal for a key in cooldown takes no row lock and writes nothing, so
// it never waits for a WAL flush: the transaction it ran in has no
// transaction id afterwards (any lock or write would have assigned one).
func TestRefusalWritesNothing(t *testing.T) {
	t.Parallel()
	for _, s := range pglimit.Strategies() {
		t.Run(string(s), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := testdb.Pool(t)
			lim, err := pglimit.New(pool, &pglimit.Config{Strategy: s, Schema: testdb.Schema(t), Cooldown: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			if d, err := lim.Allow(ctx, "hot"); err != nil || !d.Allowed {
				t.Fatalf("first request: %+v, %v", d, err)
			}
			err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				d, err := lim.AllowTx(ctx, tx, "hot")
				if err != nil || d.Allowed {
					t.Fatalf("refusal: %+v, %v", d, err)
				}
				var xid *string
				if err := tx.QueryRow(ctx, "SELECT pg_current_xact_id_if_assigned()::text").Scan(&xid); err != nil {
					return err
				}
				if xid != nil {
					t.Errorf("the refusal assigned transaction id %s: it locked or wrote", *xid)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

// AsyncCommit changes synchronous_commit for the limiter's own statement
// only: the connection it ran on keeps the application's setting.
func TestAsyncCommitStaysInItsStatement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(testdb.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1 // every statement on the same connection
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	schema := testdb.Schema(t)
	for _, s := range pglimit.Strategies() {
		lim, err := pglimit.New(pool, &pglimit.Config{Strategy: s, Schema: schema, Cooldown: time.Minute, AsyncCommit: true})
		if err != nil {
			t.Fatal(err)
		}
		if d, err := lim.Allow(ctx, "k"); err != nil || !d.Allowed {
			t.Fatalf("%s: %+v, %v", s, d, err)
		}
		var setting string
		if err := pool.QueryRow(ctx, "SHOW synchronous_commit").Scan(&setting); err != nil {
			t.Fatal(err)
		}
		if setting != "on" {
			t.Fatalf("%s: synchronous_commit is %q on the limiter's connection after Allow, want on", s, setting)
		}
	}
}

// countingDB passes every call to a real pool and counts the statements.
type countingDB struct {
	*pgxpool.Pool
	statements atomic.Int64
}

func (c *countingDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	c.statements.Add(1)
	return c.Pool.QueryRow(ctx, sql, args...)
}

// With the pre-block on, a hot key costs the database one statement per
// admission, not one per request; a Reset through the limiter lifts it at
// once.
func TestPreBlockSparesTheDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, s := range pglimit.Strategies() {
		t.Run(string(s), func(t *testing.T) {
			t.Parallel()
			db := &countingDB{Pool: testdb.Pool(t)}
			lim, err := pglimit.New(db, &pglimit.Config{Strategy: s, Schema: testdb.Schema(t), Cooldown: time.Minute, PreBlockSize: 10})
			if err != nil {
				t.Fatal(err)
			}
			// A first decision may check the table once (Range); count from
			// after it.
			if _, err := lim.Allow(ctx, "warm-up"); err != nil {
				t.Fatal(err)
			}
			db.statements.Store(0)
			for i := range 100 {
				d, err := lim.Allow(ctx, "hot")
				if err != nil || d.Allowed != (i == 0) {
					t.Fatalf("request %d: %+v, %v", i, d, err)
				}
				if !d.Allowed && (d.RetryAfter <= 0 || d.RetryAfter > time.Minute) {
					t.Fatalf("request %d: RetryAfter %s, want in (0, 1m]", i, d.RetryAfter)
				}
			}
			if n := db.statements.Load(); n != 1 {
				t.Fatalf("100 requests on a hot key ran %d statements, want 1", n)
			}
			if err := lim.Reset(ctx, "hot"); err != nil {
				t.Fatal(err)
			}
			if d, err := lim.Allow(ctx, "hot"); err != nil || !d.Allowed {
				t.Fatalf("after Reset: %+v, %v; want admitted", d, err)
			}
		})
	}
}

// Behind PgBouncer in transaction pooling mode, with the exec mode it
// needs, every strategy keeps every promise.
func TestConformanceThroughPgBouncer(t *testing.T) {
	testdb.Slow(t)
	t.Parallel()
	for _, s := range pglimit.Strategies() {
		t.Run(string(s), func(t *testing.T) {
			t.Parallel()
			pglimittest.Exercise(t, withStrategy(s, nil), pglimittest.WithPool(testdb.PgBouncerPool))
		})
	}
}

// A Reset racing an Allow that reads the key before the Reset deletes it
// leaves no stale pre-block entry: once both have returned, a key the
// database holds no row for is admitted.
func TestPreBlockResetRace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, s := range pglimit.Strategies() {
		t.Run(string(s), func(t *testing.T) {
			t.Parallel()
			pool, schema := testdb.Pool(t), testdb.Schema(t)
			cfg := pglimit.Config{Strategy: s, Schema: schema, Cooldown: time.Minute}
			other, err := pglimit.New(pool, &cfg)
			if err != nil {
				t.Fatal(err)
			}
			cfg.PreBlockSize = 10000
			lim, err := pglimit.New(pool, &cfg)
			if err != nil {
				t.Fatal(err)
			}
			var stale, raced atomic.Int64
			var wg sync.WaitGroup
			for w := range 4 {
				wg.Go(func() {
					for i := range 250 {
						key := fmt.Sprintf("k%d-%d", w, i)
						if d, err := other.Allow(ctx, key); err != nil || !d.Allowed {
							t.Errorf("%s: first request: %+v, %v", key, d, err)
							return
						}
						var refused bool
						var inner sync.WaitGroup
						inner.Go(func() {
							d, err := lim.Allow(ctx, key)
							if err != nil {
								t.Errorf("%s: %v", key, err)
							}
							refused = err == nil && !d.Allowed
						})
						if err := lim.Reset(ctx, key); err != nil {
							t.Errorf("%s: reset: %v", key, err)
						}
						inner.Wait()
						if !refused {
							continue // it ran after the Reset and was admitted
						}
						raced.Add(1)
						// The refusal ran before the DELETE, so no row is left.
						if d, err := lim.Allow(ctx, key); err != nil || !d.Allowed {
							stale.Add(1)
						}
					}
				})
			}
			wg.Wait()
			if n := stale.Load(); n > 0 {
				t.Fatalf("%d of %d keys refused after a Reset that raced a refusal, with no row in the database", n, raced.Load())
			}
		})
	}
}
